#!/usr/bin/env bash
# The GRPO recipe sweep of docs/results.md ("A GPU sweep", 2026-12-04): one 5 % cold start, then
# 7 variants x 2 seeds as parallel loops (one torch thread each) for BUDGET seconds, each
# committing rounds until it is stopped; prints recovery_table.py over every run.
# On the lent H200: BUDGET=350 bash docs/results/recovery/gpu_sweep.sh (OUT: where results go).
set -u
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
S=${PY:-python3}
W=${W:-/tmp/sw}; mkdir -p $W
T0=$(date +%s)
DEV=${DEV:-cuda}
$S -m sentinel loop --config docs/results/recovery/cold-start-5pct.yaml --run-dir $W/cold --set policy.device=$DEV ${COLDX:-} > $W/cold.log 2>&1 || { tail -20 $W/cold.log; exit 1; }
echo "cold start done in $(( $(date +%s) - T0 )) s"; grep "held-out success" $W/cold.log | tail -2
COMMON="--set policy.model=$W/cold/policy --set policy.device=$DEV --set rounds=${ROUNDS:-40} ${RUNX:-}"
declare -A V
V[base]=""
V[t07]="--set rollout.temperature=0.7"
V[t07lr1e5]="--set rollout.temperature=0.7 --set grpo.lr=1e-5 --set grpo.kl_guard=null"
V[t07out]="--set rollout.temperature=0.7 --set reward.w_format=0 --set reward.w_process=0 --set curriculum.zero_variance_on=success"
V[t07big]="--set rollout.temperature=0.7 --set batch.tasks_per_step=64"
V[t07f50]="--set rollout.temperature=0.7 --set families.0.fault_share=0.5"
V[t07uni]="--set rollout.temperature=0.7 --set generators=[]"
for name in ${ONLY:-${!V[@]}}; do for seed in ${SEEDS:-0 1}; do
  timeout -s TERM ${BUDGET:-380} $S -m sentinel loop --config docs/results/recovery/grpo-shorten-lr6e-5.yaml --run-dir $W/runs/$name-s$seed $COMMON --set seed=$seed ${V[$name]} > $W/$name-s$seed.log 2>&1 &
done; done
wait
echo "sweep done at $(( $(date +%s) - T0 )) s"
for f in $W/*-s0.log; do grep -m1 -E "Error|error:" $f && echo "^ $f"; done
$S docs/results/recovery/recovery_table.py $W/cold $W/runs | tee $OUT/sweep.txt
tar czf $OUT/logs.tgz -C $W $(cd $W && ls *.log)
tar czf $OUT/stores.tgz -C $W $(cd $W && ls runs/*/sentinel.duckdb cold/sentinel.duckdb)
ls -la $OUT
