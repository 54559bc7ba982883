#!/usr/bin/env bash
# The GPU path in one prepared script. Two lengths:
#
# --quick: what matters, in at most 8 minutes on one H100/H200 (a lease of about 15 minutes, start-up
# included), in order of value. Each step has its own time limit (seconds) and the limits sum to 480 s:
#     install          30  the wheels of .whl/ (scripts/gpu_wheels.sh) into /tmp/site, then one import check
#                          of everything the steps import (skipped without .whl/, or where hydra imports)
#     gpu_tests        90  the GPU tests by name: tests/test_gpu.py tests/test_decode_graphs.py -m gpu (a CUDA
#                          graph that fails to capture is an error there)
#     gpt_generator    30  \
#     bert_mlm         30   | 30 steps of each experiment on trainer=gpu (bf16-mixed, fused AdamW,
#     bert_classifier  30   | clipping), one validation of 2 batches, no test: pace, tokens/s, MFU
#     t5_translator    30  /
#     decode_bench     60  greedy decoding, GPT-2 124M in bf16: zoo's CUDA graph against transformers' static
#                          cache, batch 1 and 16, 128 new tokens (scripts/bench/decoding.py --gpu --quick)
#     train_bench      60  compiled training, GPT-2 124M, batch 8 x 1024: zoo against transformers, tokens/s
#                          and MFU (scripts/bench/device.py --compile on; a failed twin is a row with its
#                          error, zoo's rows kept)
#     translator_gpu   60  the translator's steady pace over 1,000 steps on trainer=gpu
#     translator_cpu   60  the same on the CPU, 2 threads, 100 steps: the pace the GPU must beat 3x
#   (total 480 s; gpu_info and the summaries take well under a second each)
# The limits are planned from the parts' sizes, not yet timed on a GPU: a step over its limit is stopped,
# marked FAILED (over N s), and the next one runs.
#
# Without --quick, the full check (planned under 30 minutes; STEP_TIMEOUT, default 300 s, bounds each step):
#   1. the GPU tests (the named files above),
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
# A GPU is lent for minutes, so no step stops the others: each runs with a time limit of its own, its output
# goes to the terminal and to $OUT/<step>.log, and as soon as it ends its status and seconds are added to
# $OUT/gpu_check.tsv and every figure so far is written to $OUT/gpu_check.json (scripts/gpu_summary.py): a
# lease that ends mid-check leaves what was measured. The script ends with every step's status and seconds,
# exiting 1 if any step failed.
#
#   OUT=results scripts/gpu_check.sh --quick    # the JSON, logs and summary in results/ (default: outputs/gpu_check/<time>/)
#   scripts/gpu_check.sh                        # the full check
#   scripts/gpu_check.sh [--quick] --dry-run    # the same steps on the CPU at a tiny size (also without CUDA)
#
# The dry run proves the script works (tests/test_gpu_check.py runs it): the experiments run as a GPU user's
# (trainer=gpu, fused AdamW) with trainer.accelerator=cpu; its figures mean nothing.
# STEP_TIMEOUT (seconds, default 300) bounds each step of the full check; PYTHON (default python) runs the steps;
# a dry run multiplies every limit by DRY_SCALE (default 10).
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
out=${OUT:-outputs/gpu_check/$(date +%Y-%m-%d_%H-%M-%S)}
limit=${STEP_TIMEOUT:-300}
dry=0 quick=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry=1 ;;
    --quick) quick=1 ;;
    *) echo "zoo: usage: scripts/gpu_check.sh [--quick] [--dry-run] (got '$arg')" >&2; exit 2 ;;
  esac
done
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
printf "step\tstatus\tseconds\n" > "$out/gpu_check.tsv"
# record NAME STATUS MS: one step's row, in the arrays, the TSV and (every figure so far) the JSON.
record() {
  local s
  names+=("$1") statuses+=("$2") seconds+=("$3")
  s=$(printf "%d.%d" $(( $3 / 1000 )) $(( $3 % 1000 / 100 )))
  printf "%s\t%s\t%s\n" "$1" "$2" "$s" >> "$out/gpu_check.tsv"
  "$py" scripts/gpu_summary.py --quiet "$out" > /dev/null 2>&1 || true  # the JSON now: a lost lease keeps it
}
# step NAME LIMIT OK_CODES COMMAND...: run COMMAND for at most LIMIT seconds, its output also in $out/NAME.log;
# an exit code in OK_CODES (space-separated, beside 0) counts as passed.
step() {
  local name=$1 cap=$2 ok=" 0 $3 " start rc status
  shift 3
  [ $dry -eq 1 ] && cap=$(( cap * ${DRY_SCALE:-10} ))  # a dry run proves the steps work, on a slow shared CPU
  echo "=== $name (at most ${cap} s): $*"
  start=$(date +%s%N)
  timeout --kill-after=5 "$cap" "$@" 2>&1 | tee "$out/$name.log"
  rc=${PIPESTATUS[0]}
  if [[ $ok == *" $rc "* ]]; then status=ok
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then status="FAILED (over ${cap} s)"; failed=1
  else status="FAILED (exit $rc)"; failed=1
  fi
  record "$name" "$status" "$(( ($(date +%s%N) - start) / 1000000 ))"  # ms
}
gpu_tests=(tests/test_gpu.py tests/test_decode_graphs.py)  # by name: -m gpu over the suite imports every module

experiments=(gpt_generator bert_mlm bert_classifier t5_translator)
declare -A size=(  # the dry run's tiny versions (as tests/test_tasks.py shrinks them)
  [gpt_generator]="data.source_args.max_files=40 data.vocab_size=300 data.seq_len=32 model.d_model=32 model.n_heads=2"
  [bert_mlm]="data.max_records=400 data.vocab_size=300 data.seq_len=48 model.d_model=32 model.n_heads=2"
  [bert_classifier]="data.max_records=400 data.vocab_size=300 data.seq_len=48 model.d_model=32 model.n_heads=2"
  [t5_translator]="data.source_args.n=400 data.vocab_size=200 data.seq_len=32 model.d_model=32 model.n_heads=2 model.d_ff=64 task.max_new_tokens=12"
)
if [ $quick -eq 1 ]; then
  # the 8-minute check (the header lists each step's limit); on the CPU (--dry-run) the same steps, tiny
  if [ $dry -eq 1 ]; then
    echo "quick dry run on the CPU (tiny models; the figures mean nothing)"
    record install "skipped (dry run)" 0
    on=(trainer.accelerator=cpu optimizer.fused=true callbacks.rich_progress_bar=null)
    step gpu_tests 90 5 "$py" -m pytest -m gpu -q -p no:cacheprovider "${gpu_tests[@]}"  # 5: every test skipped
  else
    if [ -d .whl ] && ! "$py" -c "import hydra" 2>/dev/null; then  # a bare machine: the carried wheels
      step install 30 "" env PYTHON="$py" bash scripts/gpu_wheels.sh --install
      export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    else
      record install "skipped (nothing to install)" 0
    fi
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu_info.log" 2>&1 || true
    on=()
    step gpu_tests 90 "" "$py" -m pytest -m gpu -q -p no:cacheprovider "${gpu_tests[@]}"
  fi
  short=(trainer.max_steps=30 trainer.val_check_interval=30 trainer.limit_val_batches=2
    trainer.num_sanity_val_steps=0 test=false)
  for exp in "${experiments[@]}"; do
    tiny=(); [ $dry -eq 1 ] && read -ra tiny <<< "${size[$exp]}"
    step "$exp" 30 "" "$py" -m tasks.cli.train "experiment=$exp" trainer=gpu "${on[@]}" "${tiny[@]}" "${short[@]}" \
      "hydra.run.dir=$out/$exp"
  done
  if [ $dry -eq 1 ]; then
    step decode_bench 60 "" "$py" scripts/bench/decoding.py --gpu --dry-run --json "$out/decode_bench.json"
    step train_bench 60 "" "$py" scripts/bench/device.py --preset gpt-tiny --batch 2 --length 64 --steps 2 --rounds 1 \
      --device cpu --compile off --json "$out/gpu_bench.json"
  else
    step decode_bench 60 "" "$py" scripts/bench/decoding.py --gpu --quick --json "$out/decode_bench.json"
    step train_bench 60 "" "$py" scripts/bench/device.py --preset gpt2 --batch 8 --length 1024 --steps 5 --rounds 2 \
      --compile on --json "$out/gpu_bench.json"
  fi
  # the translator's steady pace (the tokens/s windows after the first): 1,000 steps on the GPU, 100 on 2 cores
  tiny=(); [ $dry -eq 1 ] && read -ra tiny <<< "${size[t5_translator]}"
  pace=(trainer.limit_val_batches=1 trainer.num_sanity_val_steps=0 test=false)
  gpu_steps=1000 cpu_steps=100; [ $dry -eq 1 ] && gpu_steps=20 cpu_steps=20
  step translator_gpu 60 "" "$py" -m tasks.cli.train experiment=t5_translator trainer=gpu "${on[@]}" "${tiny[@]}" \
    "${pace[@]}" trainer.max_steps=$gpu_steps trainer.val_check_interval=$gpu_steps "hydra.run.dir=$out/translator_gpu"
  step translator_cpu 60 "" env OMP_NUM_THREADS=2 "$py" -m tasks.cli.train experiment=t5_translator \
    trainer.accelerator=cpu callbacks.rich_progress_bar=null "${tiny[@]}" "${pace[@]}" trainer.max_steps=$cpu_steps \
    trainer.val_check_interval=$cpu_steps "hydra.run.dir=$out/translator_cpu"
elif [ $dry -eq 0 ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu_info.log" 2>&1 || true
  step gpu_tests "$limit" "" "$py" -m pytest -m gpu -q -p no:cacheprovider "${gpu_tests[@]}"
  # the experiments as the README runs them, on one GPU; all but the default one cut to 300 steps
  for exp in "${experiments[@]}"; do
    steps=(); [ "$exp" != gpt_generator ] && steps=(trainer.max_steps=300)
    step "$exp" "$limit" "" "$py" -m tasks.cli.train "experiment=$exp" trainer=gpu "${steps[@]}" \
      "hydra.run.dir=$out/$exp"
  done
  step train_bench "$limit" "" "$py" scripts/bench/device.py --preset gpt2 --batch 16 --length 1024 --steps 10 \
    --rounds 3 --json "$out/gpu_bench.json"
  step decode_bench "$limit" "" "$py" scripts/bench/decoding.py --gpu --json "$out/decode_bench.json"
  step flex_bench "$limit" "" "$py" scripts/bench/flex.py --tokens 8192 --lengths 1024 2048 4096 --steps 5 \
    --json "$out/flex_bench.json"
else
  echo "dry run on the CPU (tiny models, torch.compile off; the figures mean nothing)"
  step gpu_tests "$limit" 5 "$py" -m pytest -m gpu -q -p no:cacheprovider "${gpu_tests[@]}"  # 5: every test skipped
  for exp in "${experiments[@]}"; do  # what a GPU user runs, on the CPU: bf16-mixed, fused AdamW, clipping
    read -ra tiny <<< "${size[$exp]}"
    step "$exp" "$limit" "" "$py" -m tasks.cli.train "experiment=$exp" trainer=gpu trainer.accelerator=cpu \
      optimizer.fused=true "${tiny[@]}" trainer.max_steps=4 trainer.val_check_interval=2 trainer.limit_val_batches=2 \
      trainer.limit_test_batches=2 callbacks.rich_progress_bar=null "hydra.run.dir=$out/$exp"
  done
  step train_bench "$limit" "" "$py" scripts/bench/device.py --preset gpt-tiny --batch 2 --length 64 --steps 2 \
    --device cpu --compile off --json "$out/gpu_bench.json"
  step decode_bench "$limit" "" "$py" scripts/bench/decoding.py --gpu --dry-run --json "$out/decode_bench.json"
  step flex_bench "$limit" "" "$py" scripts/bench/flex.py --device cpu --tokens 64 --lengths 16 32 --steps 1 \
    --d-model 64 --n-layers 2 --json "$out/flex_bench.json"   # flex_attention has no CPU backward: forward only
fi

# Multi-GPU (2 devices or more; not in the dry run): a short GPT run under each distributed trainer, then the
# tensor- and pipeline-parallel runs' checkpoints (zoo's whole tensors) resumed on one GPU for 10 more steps.
gpus=0
[ $dry -eq 0 ] && [ $quick -eq 0 ] && gpus=$("$py" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "${gpus:-0}" -ge 2 ]; then
  tiny=(experiment=gpt_generator data.source_args.max_files=200 data.seq_len=256 trainer.max_steps=40
    trainer.val_check_interval=20 trainer.limit_val_batches=4 test=false callbacks.rich_progress_bar=null)
  step ddp_train "$limit" "" "$py" -m tasks.cli.train "${tiny[@]}" trainer=ddp trainer.devices=2 trainer.accelerator=gpu \
    trainer.precision=bf16-mixed "hydra.run.dir=$out/ddp_run"
  step fsdp_train "$limit" "" "$py" -m tasks.cli.train "${tiny[@]}" trainer=fsdp trainer.devices=2 "hydra.run.dir=$out/fsdp_run"
  step tp_train "$limit" "" "$py" -m tasks.cli.train "${tiny[@]}" trainer=tp trainer.devices=2 trainer.accelerator=gpu \
    trainer.precision=bf16-mixed "hydra.run.dir=$out/tp_run"
  step tp_to_one_gpu "$limit" "" "$py" -m tasks.cli.train "${tiny[@]}" trainer=gpu trainer.max_steps=50 \
    "ckpt_path=$out/tp_run/checkpoints/last.ckpt" "hydra.run.dir=$out/tp_to_one_gpu"
  step pp_train "$limit" "" "$py" -m tasks.cli.train "${tiny[@]}" trainer=pp trainer.devices=2 trainer.accelerator=gpu \
    trainer.precision=bf16-mixed "hydra.run.dir=$out/pp_run"
  step pp_to_one_gpu "$limit" "" "$py" -m tasks.cli.train "${tiny[@]}" trainer=gpu trainer.max_steps=50 \
    "ckpt_path=$out/pp_run/checkpoints/last.ckpt" "hydra.run.dir=$out/pp_to_one_gpu"
elif [ $dry -eq 0 ] && [ $quick -eq 0 ]; then
  echo "one GPU: the multi-GPU steps (ddp_train, fsdp_train, tp_train, tp_to_one_gpu, pp_train, pp_to_one_gpu) need two or more"
fi

echo
echo "gpu_check summary ($([ $quick -eq 1 ] && echo "quick, ")$([ $dry -eq 1 ] && echo "dry run" || echo GPU), output in $out/):"
for i in "${!names[@]}"; do
  s=$(printf "%d.%d" $(( seconds[i] / 1000 )) $(( seconds[i] % 1000 / 100 )))
  printf "  %-20s %-28s %7s s\n" "${names[$i]}" "${statuses[$i]}" "$s"
done
"$py" scripts/gpu_summary.py "$out" || failed=1   # every figure in $out/gpu_check.json, said
exit $failed
