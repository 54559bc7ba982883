#!/usr/bin/env bash
# zoo as a user receives it: build the sdist and, from it, the wheel; install the wheel into a fresh
# virtual environment in a folder outside this checkout; from there import every module of zoo/, tasks/
# and hydra_plugins/ and run every verb on tiny settings (the four experiments, zoo-generate, zoo-eval,
# zoo-export format=hf, trainer=tp on 2 gloo processes, a two-trial sweep and zoo-sweep-report, and with
# the tracking extra the muP search tracked in MLflow).
#
#   scripts/wheel_check.sh            # about 6 minutes on 2 CPU cores (.ci/run runs it)
#
# Needs `build` (pip install build) in the Python that runs it, and an index that serves torch==2.13.0
# (or set ZOO_TORCH to the requirement to install, e.g. ZOO_TORCH=torch-2.13.0-*.whl).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/zoo-wheel.XXXXXX")   # outside the tree: nothing imports the checkout
trap 'status=$?; [ $status -eq 0 ] && rm -rf "$work" || echo "wheel check failed ($status); its files: $work"' EXIT
step() { printf '\n== %s\n' "$*"; }

step "build the sdist, then the wheel from it"
python -m build --sdist --wheel --outdir "$work/dist" "$root" >"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }
ls "$work/dist"
wheel=$(ls "$work"/dist/zoo-*.whl)

step "install the wheel (and transformers, for zoo-export format=hf) into a fresh venv"
python -m venv "$work/venv"
export PATH="$work/venv/bin:$PATH" PYTHONWARNINGS=ignore OMP_NUM_THREADS=1 COLUMNS=160
pip_install() { python -m pip install --quiet --disable-pip-version-check "$@"; }
pip_install "${ZOO_TORCH:-torch==2.13.0}"   # first: a bare torch requirement would pull the CUDA build
pip_install "$wheel[hf]"
mkdir "$work/user" && cd "$work/user"

step "import every module of the tree from the installed wheel"
python - "$root" <<'PY'
import importlib, sys
from pathlib import Path

root, site = Path(sys.argv[1]), Path(sys.prefix)
names = sorted(
    ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
    for top in ("zoo", "tasks", "hydra_plugins")
    for p in (root / top).rglob("*.py")
    if "__pycache__" not in p.parts
)
for name in names:
    module = importlib.import_module(name)
    where = Path(module.__file__).resolve()
    assert where.is_relative_to(site.resolve()), f"{name} was imported from {where}, not the installed wheel"
print(f"{len(names)} modules imported from {site}")
PY

tiny=(data.vocab_size=300 data.seq_len=32 model.d_model=32 model.n_heads=2 trainer.max_steps=4
      trainer.val_check_interval=2 trainer.limit_val_batches=1 trainer.limit_test_batches=1
      trainer.num_sanity_val_steps=0)
gpt=(data.source_args.max_files=40 task.sample_tokens=4)
records=(data.max_records=400 data.seq_len=48)
step "zoo-train: the default experiment"
zoo-train "${tiny[@]}" "${gpt[@]}" hydra.run.dir=runs/gpt
step "zoo-train experiment=bert_mlm"
zoo-train experiment=bert_mlm "${tiny[@]}" "${records[@]}" hydra.run.dir=runs/mlm
step "zoo-train experiment=bert_classifier"
zoo-train experiment=bert_classifier "${tiny[@]}" "${records[@]}" hydra.run.dir=runs/classifier
step "zoo-train experiment=t5_translator"
zoo-train experiment=t5_translator "${tiny[@]}" data.source_args.n=400 data.vocab_size=200 model.d_ff=64 \
  task.max_new_tokens=12 hydra.run.dir=runs/translator
step "zoo-generate, zoo-eval, zoo-export format=hf"
zoo-generate ckpt_path=runs/gpt/checkpoints/last.ckpt prompt="def" max_new_tokens=8
zoo-generate ckpt_path=runs/translator/checkpoints/last.ckpt prompt="forty-two"
zoo-eval ckpt_path=runs/classifier/checkpoints/last.ckpt
zoo-export ckpt_path=runs/gpt/checkpoints/last.ckpt format=hf out=exported/hf
test -f exported/hf/config.json
step "zoo-train trainer=tp: 2 gloo processes"
zoo-train trainer=tp "${tiny[@]}" "${gpt[@]}" model.n_heads=4 model.n_kv_heads=2 model.d_ff=64 hydra.run.dir=runs/tp
step "a two-trial sweep, then zoo-sweep-report"
zoo-train -m hydra/sweeper=zoo_optuna "optimizer.lr=tag(log, interval(1e-4, 1e-2))" hydra.sweeper.n_trials=2 \
  hydra.sweeper.sampler=random hydra.sweeper.seed=0 "${tiny[@]}" "${gpt[@]}" test=false hydra.sweep.dir=sweep
zoo-sweep-report sweep
test -f sweep/sweep_report.md
step "the tracking extra: the muP search on the narrow model, tracked in MLflow"
pip_install "$wheel[tracking]"
zoo-train -m hparams_search=gpt_generator_mup_optuna logger=mlflow hydra.sweeper.n_trials=1 data.vocab_size=300 \
  data.seq_len=32 trainer.max_steps=2 trainer.val_check_interval=2 trainer.limit_val_batches=1 \
  trainer.num_sanity_val_steps=0 "${gpt[@]}" test=false hydra.sweep.dir=mup
python - <<'PY'
from mlflow.tracking import MlflowClient

client = MlflowClient("sqlite:///outputs/mlflow.db")
(experiment,) = [e for e in client.search_experiments() if e.name == "gpt_generator mup"]
(run,) = client.search_runs([experiment.experiment_id])
assert run.info.status == "FINISHED" and run.data.params["model.mup_base_d_model"] == "64", run
assert [m.step for m in client.get_metric_history(run.info.run_id, "val/loss")] == [2]
print(f"MLflow: run {run.info.run_id} of experiment {experiment.name!r}, {len(run.data.params)} parameters")
PY
step "the wheel trains and runs every verb outside the tree"
