#!/usr/bin/env bash
# Every ablation sweep of the paper (docs/design.md, section 5) at mini scale, one after another, then the tables.
# About 90 minutes on 2 CPU cores. Usage: bash scripts/mini_sweeps.sh [sweep ...]
# Results: runs/sweeps/<sweep>_mini/*; tables: docs/ablations_mini.{md,csv,tex}.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
sweeps=("$@")
[ ${#sweeps[@]} -gt 0 ] || sweeps=(where method_mode buckets shared_head index cost detr_ape)
for sweep in "${sweeps[@]}"; do
  echo "=== sweep=${sweep}_mini ($(date +%H:%M:%S))"
  "$PY" train.py "sweep=${sweep}_mini" || echo "sweep ${sweep}_mini had failed jobs (see above)"
done
"$PY" scripts/make_tables.py runs/sweeps/*_mini --out docs/ablations_mini
