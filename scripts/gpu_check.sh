#!/usr/bin/env bash
# The GPU path in one prepared script (under 8 minutes on an H100/H200-class GPU):
#   1. the GPU tests (pytest -m gpu),
#   2. scripts/bench/device.py: GPT-2-124M training throughput and MFU, bf16 autocast, fused AdamW, SDPA kernels,
#      torch.compile off and on,
#   3. scripts/bench/flex.py: ALiBi and T5-bias training tokens/s and peak memory at T = 1024, 2048, 4096 with
#      attention=flex and attention=auto (FlexMods: bias and mask computed in the kernel) against sdpa with a
#      bias tensor, and RoPE on sdpa; each row says whether the layers got FlexMods and its ratio to RoPE.
# Without CUDA it runs a dry mode: the same steps on the CPU with a tiny model, to prove the script works.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-.}
if python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  python -m pytest -m gpu -q -p no:cacheprovider
  python scripts/bench/device.py --preset gpt2 --batch 16 --length 1024 --steps 20 --json "$out/gpu_bench.json"
  python scripts/bench/flex.py --tokens 8192 --lengths 1024 2048 4096 --steps 5 --json "$out/flex_bench.json"
else
  echo "no CUDA device: dry run on the CPU (tiny model; the figures mean nothing)"
  python -m pytest -m gpu -q -p no:cacheprovider || [ $? -eq 5 ]   # 5: every gpu test skipped
  python scripts/bench/device.py --preset gpt-tiny --batch 2 --length 64 --steps 2 --device cpu \
    --json "$out/gpu_bench.json"
  python scripts/bench/flex.py --device cpu --tokens 64 --lengths 16 32 --steps 1 --d-model 64 --n-layers 2 \
    --json "$out/flex_bench.json"   # flex_attention has no CPU backward: forward only
fi
