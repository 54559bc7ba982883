#!/usr/bin/env bash
# Wheels for a GPU machine without network, for scripts/gpu_check.sh: the workplace's fetch-wheels.sh
# (hydra-core, omegaconf, antlr4, optuna and its needs, num2words), then what zoo's checks need beyond them:
# sacrebleu (the translator's chrF, tasks/text_metrics.py) and its needs, and pytest and its needs (the
# GPU tests). Run from the project root; writes .whl/ (or the folder given). Nothing the checks run imports
# matplotlib (only zoo-attention's plots do), so it is not among them.
#
#   scripts/gpu_wheels.sh                # here, with network: .whl/
#   scripts/gpu_wheels.sh --install      # on the GPU machine: .whl/ into /tmp/site (gpu_check.sh --quick does
#                                        # this itself), then one line naming any module the checks import
#                                        # that is still missing; PYTHONPATH=/tmp/site:$PWD makes them seen
set -euo pipefail
cd "$(dirname "$0")/.."
NEEDS=(hydra omegaconf lightning torchmetrics rich tokenizers safetensors num2words sacrebleu optuna pytest transformers)
if [ "${1:-}" = --install ]; then
  py=${PYTHON:-python3}
  site=${SITE:-/tmp/site}
  shopt -s nullglob
  wheels=(.whl/*.whl)
  if [ ${#wheels[@]} -eq 0 ]; then
    echo "zoo: FileNotFoundError: no wheels in .whl/; run scripts/gpu_wheels.sh where there is network" >&2
    exit 2
  fi
  "$py" -m pip install -q --no-index --no-deps --no-compile --target "$site" "${wheels[@]}"
  PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}" "$py" - "${NEEDS[@]}" <<'PY'
import importlib.util
import sys

missing = [name for name in sys.argv[1:] if importlib.util.find_spec(name) is None]
print(f"zoo: missing on this machine: {' '.join(missing)}" if missing else "every module the checks import is here")
sys.exit(1 if missing else 0)
PY
  exit
fi
dest=${1:-.whl}
fetch=${FETCH_WHEELS:-../shared/gpu/fetch-wheels.sh}
if [ ! -x "$fetch" ] && [ ! -f "$fetch" ]; then
  echo "zoo: FileNotFoundError: $fetch not found; set FETCH_WHEELS= to the workplace's fetch-wheels.sh" >&2
  exit 2
fi
bash "$fetch" "$dest"
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do plat+=(--platform "$p"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d "$dest" "sacrebleu>=2.3,<3" portalocker tabulate colorama lxml \
  "pytest>=8" iniconfig pluggy pygments packaging
ls "$dest"
