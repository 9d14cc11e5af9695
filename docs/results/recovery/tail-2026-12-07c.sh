#!/bin/bash
# The ninth run's outputs: RUNS=runs bash docs/results/recovery/tail-2026-12-07c.sh (from the repository root)
R=${RUNS:-runs}
P=".venv/bin/python docs/results/recovery"
{
echo "# Ninth run (2026-12-07, day): three failure-arm variants on the tail bench's kept cold start (runs/tail), 5 paired seeds"
echo "# runs/X below is $RUNS/X (/tmp/runs on the machine that ran them)"
for v in tail-prog tail-new tail-once; do
  echo; echo "## $v"; echo '$ python docs/results/recovery/pair_with_bench.py runs/tail/results.json '$v'=runs/'$v
  $P/pair_with_bench.py $R/tail/results.json $v=$R/$v | sed "s#$R/#runs/#g"
  echo '$ python docs/results/recovery/bench_by_type.py runs/'$v
  $P/bench_by_type.py $R/$v | sed "s#$R/#runs/#g"
  echo '$ python docs/results/recovery/training_mix.py runs/'$v'/failure-s{0,1,2,3,4}'
  $P/training_mix.py $R/$v/failure-s{0,1,2,3,4}
  echo '$ python docs/results/recovery/instance_reuse.py runs/'$v'/failure-s{0,1,2,3,4}'
  $P/instance_reuse.py $R/$v/failure-s{0,1,2,3,4}
done
for v in tail/failure tail/exposure tail-sfl/failure; do
  echo; echo "## instance reuse, runs/$v"; echo '$ python docs/results/recovery/instance_reuse.py runs/'$v'-s{0,1,2,3,4}'
  $P/instance_reuse.py $R/$v-s{0,1,2,3,4}
done
} > docs/results/recovery/tail-2026-12-07c.txt 2>&1
for v in tail-prog tail-new tail-once; do cp $R/$v/results.json docs/results/recovery/bench-2026-12-07-${v#tail-}.json; done
