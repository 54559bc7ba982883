#!/usr/bin/env bash
# Wheels for a GPU machine without network, for scripts/gpu_check.sh: the workplace's fetch-wheels.sh
# (hydra-core, omegaconf, antlr4, optuna and its needs, num2words), then what zoo needs beyond them:
# sacrebleu (the translator's chrF, tasks/text_metrics.py) and its needs. Run from the project root;
# writes .whl/ (or the folder given), installed on the GPU machine as fetch-wheels.sh's header says.
#
#   scripts/gpu_wheels.sh                # .whl/
set -euo pipefail
cd "$(dirname "$0")/.."
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
  -d "$dest" "sacrebleu>=2.3,<3" portalocker tabulate colorama lxml
ls "$dest"
