#!/bin/bash
# The eighth run's outputs: RUNS=runs bash docs/results/recovery/tail-2026-12-07b.sh (from the repository root)
R=${RUNS:-runs}
P=".venv/bin/python docs/results/recovery"
{
echo "# Eighth run (2026-12-07, morning): four failure-arm variants and two exposure variants on the tail bench's kept cold start (runs/tail), 5 paired seeds"
echo "# runs/X below is $RUNS/X (/tmp/runs on the machine that ran them)"
for v in tail-sfl tail-sfl-fault tail-nogate tail-gexp; do
  echo; echo "## $v"; echo '$ python docs/results/recovery/pair_with_bench.py runs/tail/results.json '$v'=runs/'$v
  $P/pair_with_bench.py $R/tail/results.json $v=$R/$v | sed "s#$R/#runs/#g"
  echo '$ python docs/results/recovery/bench_by_type.py runs/'$v
  $P/bench_by_type.py $R/$v | sed "s#$R/#runs/#g"
  echo '$ python docs/results/recovery/training_mix.py runs/'$v'/failure-s{0,1,2,3,4}'
  $P/training_mix.py $R/$v/failure-s{0,1,2,3,4}
done
echo; echo "## exposure on the three rewrite faults only (plus, colon, minus)"
echo '$ python docs/results/recovery/bench_by_type.py runs/tail-tailexp'
$P/bench_by_type.py $R/tail-tailexp | sed "s#$R/#runs/#g"
echo; echo "## retries of the copy-remedy faults (timeout, rate_limit, truncated), held-out, first and last eval, 5 seeds summed"
echo '$ python docs/results/recovery/retry_drift.py exposure=runs/tail/exposure-s{0..4} ... (as below)'
$P/retry_drift.py exposure=$R/tail/exposure-s{0,1,2,3,4} uniform=$R/tail/uniform-s{0,1,2,3,4} filter=$R/tail/filter-s{0,1,2,3,4} gated-exposure=$R/tail-gexp/failure-s{0,1,2,3,4} rewrite-exposure=$R/tail-tailexp/exposure-s{0,1,2,3,4} failure=$R/tail/failure-s{0,1,2,3,4} failure-floor=$R/tail-floor/failure-s{0,1,2,3,4} sfl=$R/tail-sfl/failure-s{0,1,2,3,4} sfl-fault=$R/tail-sfl-fault/failure-s{0,1,2,3,4} nogate=$R/tail-nogate/failure-s{0,1,2,3,4}
echo; echo "## failed notation tasks whose first call divides (the colon remedy written for x), last eval"
echo '$ python docs/results/recovery/notation_divides.py runs/tail-tailexp/exposure-s{0..4}; the same for runs/tail/exposure-s{0..4}'
$P/notation_divides.py $R/tail-tailexp/exposure-s{0,1,2,3,4}
$P/notation_divides.py $R/tail/exposure-s{0,1,2,3,4}
echo; echo "## step sizes"
echo '$ python docs/results/recovery/step_sizes.py runs/tail/{exposure,failure}-s{0..4} runs/tail-nogate/failure-s{0..4} runs/tail-gexp/failure-s{0..4}'
$P/step_sizes.py $R/tail/exposure-s{0,1,2,3,4} $R/tail/failure-s{0,1,2,3,4} $R/tail-nogate/failure-s{0,1,2,3,4} $R/tail-gexp/failure-s{0,1,2,3,4} | sed "s#$R/#runs/#g"
} > docs/results/recovery/tail-2026-12-07b.txt 2>&1
for v in tail-sfl tail-sfl-fault tail-nogate tail-gexp; do cp $R/$v/results.json docs/results/recovery/bench-2026-12-07-${v#tail-}.json; done
