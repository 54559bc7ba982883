#!/usr/bin/env bash
# The GPU path in one prepared script, what the README promises for a GPU (planned to take under 8 minutes on one
# H100/H200, estimated from the steps' parts: not yet timed on a GPU; STEP_TIMEOUT bounds each step):
#   1. the GPU tests (pytest -m gpu),
#   2. every experiment on trainer=gpu (bf16-mixed, fused AdamW, clipping), a few hundred steps each: each
#      run's pace (it/s, validation included), tokens/s, MFU and metrics,
#   3. scripts/bench/device.py: GPT-2-124M training, zoo against transformers side by side, eager and compiled
#      (tokens/s, MFU, peak memory; goals: >= 45% MFU and >= 1.3x transformers compiled),
#   4. scripts/bench/decoding.py: GPT-2-124M greedy decoding in bf16, zoo's CUDA-graph path (compile=True)
#      against transformers' static-cache compiled generate at batch 1 and 16 (goals: >= 1.5x, >= 2,000 tok/s
#      at batch 1),
#   5. scripts/bench/flex.py: ALiBi and T5-bias training at T = 1024, 2048, 4096 with attention=flex and auto
#      against sdpa with a bias tensor, and RoPE on sdpa,
#   6. with two GPUs or more: short GPT runs under trainer=ddp, fsdp, tp and pp, and the tp and pp runs'
#      checkpoints resumed on one GPU.
# A GPU is lent for minutes, so no step stops the others: each runs (with a time limit of its own), its output
# goes to the terminal and to $OUT/<step>.log, and the script ends with every step's status and seconds (also
# in $OUT/gpu_check.tsv) and every figure in one JSON ($OUT/gpu_check.json, scripts/gpu_summary.py), exiting 1
# if any step failed.
#
#   OUT=results scripts/gpu_check.sh      # the JSON, logs and summary in results/ (default: outputs/gpu_check/<time>/)
#   scripts/gpu_check.sh --dry-run        # the same steps on the CPU at a tiny size (also without CUDA)
#
# The dry run proves the script works (tests/test_gpu_check.py runs it): the experiments run as a GPU user's
# (trainer=gpu, fused AdamW) with trainer.accelerator=cpu; its figures mean nothing.
# STEP_TIMEOUT (seconds, default 300) bounds each step; PYTHON (default python) runs the steps.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
out=${OUT:-outputs/gpu_check/$(date +%Y-%m-%d_%H-%M-%S)}
limit=${STEP_TIMEOUT:-300}
dry=0
case "${1:-}" in
  --dry-run) dry=1 ;;
  "") ;;
  *) echo "zoo: usage: scripts/gpu_check.sh [--dry-run] (got '$1')" >&2; exit 2 ;;
esac
if ! mkdir -p "$out" 2>/dev/null || [ ! -w "$out" ]; then
  echo "zoo: OSError: cannot write the output folder '$out'; set OUT= to a writable folder" >&2
  exit 2
fi
for file in gpu_check.tsv gpu_check.json gpu_bench.json decode_bench.json flex_bench.json; do  # never overwrite an earlier check's results
  if [ -e "$out/$file" ]; then
    echo "zoo: FileExistsError: '$out/$file' is from an earlier check; set OUT= to a new or empty folder" >&2
    exit 2
  fi
done
if [ $dry -eq 0 ] && ! "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "no CUDA device: dry run on the CPU"
  dry=1
fi

names=() statuses=() seconds=() failed=0
# step NAME OK_CODES COMMAND...: run COMMAND under the time limit, its output also in $out/NAME.log; an exit
# code in OK_CODES (space-separated, beside 0) counts as passed.
step() {
  local name=$1 ok=" 0 $2 " start rc status
  shift 2
  echo "=== $name: $*"
  start=$(date +%s%N)
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$out/$name.log"
  rc=${PIPESTATUS[0]}
  if [[ $ok == *" $rc "* ]]; then status=ok
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then status="FAILED (over ${limit} s)"; failed=1
  else status="FAILED (exit $rc)"; failed=1
  fi
  names+=("$name") statuses+=("$status") seconds+=("$(( ($(date +%s%N) - start) / 1000000 ))")  # ms
}

experiments=(gpt_generator bert_mlm bert_classifier t5_translator)
declare -A size=(  # the dry run's tiny versions (as tests/test_tasks.py shrinks them)
  [gpt_generator]="data.source_args.max_files=40 data.vocab_size=300 data.seq_len=32 model.d_model=32 model.n_heads=2"
  [bert_mlm]="data.max_records=400 data.vocab_size=300 data.seq_len=48 model.d_model=32 model.n_heads=2"
  [bert_classifier]="data.max_records=400 data.vocab_size=300 data.seq_len=48 model.d_model=32 model.n_heads=2"
  [t5_translator]="data.source_args.n=400 data.vocab_size=200 data.seq_len=32 model.d_model=32 model.n_heads=2 model.d_ff=64 task.max_new_tokens=12"
)
if [ $dry -eq 0 ]; then
  step gpu_info "" nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  step gpu_tests "" "$py" -m pytest -m gpu -q -p no:cacheprovider
  # the experiments as the README runs them, on one GPU; all but the default one cut to 300 steps
  for exp in "${experiments[@]}"; do
    steps=(); [ "$exp" != gpt_generator ] && steps=(trainer.max_steps=300)
    step "$exp" "" "$py" -m tasks.cli.train "experiment=$exp" trainer=gpu "${steps[@]}" "hydra.run.dir=$out/$exp"
  done
  step train_bench "" "$py" scripts/bench/device.py --preset gpt2 --batch 16 --length 1024 --steps 10 --rounds 3 \
    --json "$out/gpu_bench.json"
  step decode_bench "" "$py" scripts/bench/decoding.py --gpu --json "$out/decode_bench.json"
  step flex_bench "" "$py" scripts/bench/flex.py --tokens 8192 --lengths 1024 2048 4096 --steps 5 \
    --json "$out/flex_bench.json"
else
  echo "dry run on the CPU (tiny models, torch.compile off; the figures mean nothing)"
  step gpu_tests 5 "$py" -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py   # 5: every gpu test skipped
  for exp in "${experiments[@]}"; do  # what a GPU user runs, on the CPU: bf16-mixed, fused AdamW, clipping
    read -ra tiny <<< "${size[$exp]}"
    step "$exp" "" "$py" -m tasks.cli.train "experiment=$exp" trainer=gpu trainer.accelerator=cpu \
      optimizer.fused=true "${tiny[@]}" trainer.max_steps=4 trainer.val_check_interval=2 trainer.limit_val_batches=2 \
      trainer.limit_test_batches=2 callbacks.rich_progress_bar=null "hydra.run.dir=$out/$exp"
  done
  step train_bench "" "$py" scripts/bench/device.py --preset gpt-tiny --batch 2 --length 64 --steps 2 \
    --device cpu --compile off --json "$out/gpu_bench.json"
  step decode_bench "" "$py" scripts/bench/decoding.py --gpu --dry-run --json "$out/decode_bench.json"
  step flex_bench "" "$py" scripts/bench/flex.py --device cpu --tokens 64 --lengths 16 32 --steps 1 --d-model 64 \
    --n-layers 2 --json "$out/flex_bench.json"   # flex_attention has no CPU backward: forward only
fi

# Multi-GPU (2 devices or more; not in the dry run): a short GPT run under each distributed trainer, then the
# tensor- and pipeline-parallel runs' checkpoints (zoo's whole tensors) resumed on one GPU for 10 more steps.
gpus=0
[ $dry -eq 0 ] && gpus=$("$py" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "${gpus:-0}" -ge 2 ]; then
  tiny=(experiment=gpt_generator data.source_args.max_files=200 data.seq_len=256 trainer.max_steps=40
    trainer.val_check_interval=20 trainer.limit_val_batches=4 test=false callbacks.rich_progress_bar=null)
  step ddp_train "" "$py" -m tasks.cli.train "${tiny[@]}" trainer=ddp trainer.devices=2 trainer.accelerator=gpu \
    trainer.precision=bf16-mixed "hydra.run.dir=$out/ddp_run"
  step fsdp_train "" "$py" -m tasks.cli.train "${tiny[@]}" trainer=fsdp trainer.devices=2 "hydra.run.dir=$out/fsdp_run"
  step tp_train "" "$py" -m tasks.cli.train "${tiny[@]}" trainer=tp trainer.devices=2 trainer.accelerator=gpu \
    trainer.precision=bf16-mixed "hydra.run.dir=$out/tp_run"
  step tp_to_one_gpu "" "$py" -m tasks.cli.train "${tiny[@]}" trainer=gpu trainer.max_steps=50 \
    "ckpt_path=$out/tp_run/checkpoints/last.ckpt" "hydra.run.dir=$out/tp_to_one_gpu"
  step pp_train "" "$py" -m tasks.cli.train "${tiny[@]}" trainer=pp trainer.devices=2 trainer.accelerator=gpu \
    trainer.precision=bf16-mixed "hydra.run.dir=$out/pp_run"
  step pp_to_one_gpu "" "$py" -m tasks.cli.train "${tiny[@]}" trainer=gpu trainer.max_steps=50 \
    "ckpt_path=$out/pp_run/checkpoints/last.ckpt" "hydra.run.dir=$out/pp_to_one_gpu"
elif [ $dry -eq 0 ]; then
  echo "one GPU: the multi-GPU steps (ddp_train, fsdp_train, tp_train, tp_to_one_gpu, pp_train, pp_to_one_gpu) need two or more"
fi

echo
echo "gpu_check summary ($([ $dry -eq 1 ] && echo "dry run" || echo GPU), output in $out/):"
printf "step\tstatus\tseconds\n" > "$out/gpu_check.tsv"
for i in "${!names[@]}"; do
  s=$(printf "%d.%d" $(( seconds[i] / 1000 )) $(( seconds[i] % 1000 / 100 )))
  printf "  %-20s %-24s %7s s\n" "${names[$i]}" "${statuses[$i]}" "$s"
  printf "%s\t%s\t%s\n" "${names[$i]}" "${statuses[$i]}" "$s" >> "$out/gpu_check.tsv"
done
"$py" scripts/gpu_summary.py "$out" || failed=1   # every figure in $out/gpu_check.json
exit $failed
