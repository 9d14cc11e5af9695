#!/usr/bin/env bash
# One GPU, under 8 minutes: a 2-round loop of configs/gpu_smoke.yaml on CUDA, then rollout
# tokens/s of the hf and vllm backends side by side (benchmarks/rollout.py).
#   benchmarks/gpu_smoke.sh [MODEL_DIR]
# MODEL_DIR: a local HF model directory (a small chat model); default the embedded tiny policy.
# Where vLLM does not import, the loop runs with the hf backend and only hf is timed; the script
# says so. PYTHON selects the interpreter (default: python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
MODEL=${1:-}
RUN=${RUN_DIR:-runs/gpu-smoke}
args=(--config configs/gpu_smoke.yaml --run-dir "$RUN")
bench=(--device cuda --rounds 3)
if [ -n "$MODEL" ]; then
  # A real chat model already writes tool calls: no cold start, its own dtype on the GPU.
  args+=(--set "policy.model=$MODEL" --set sft.enabled=false --set policy.dtype=bfloat16)
  bench+=(--policy "$MODEL")
fi
if $PY -c "import vllm" 2>/dev/null; then
  backends=hf,vllm
else
  echo "gpu_smoke: vllm does not import here; the loop runs with rollout.backend=hf and only hf is timed"
  args+=(--set rollout.backend=hf)
  backends=hf
fi
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('device:', torch.cuda.get_device_name(0), 'torch', torch.__version__)"
rm -rf "$RUN"
start=$(date +%s)
$PY -m sentinel loop "${args[@]}"
echo "gpu_smoke: loop done in $(( $(date +%s) - start )) s"
$PY -m sentinel status --run-dir "$RUN"
$PY benchmarks/rollout.py "${bench[@]}" --backends "$backends"
