#!/usr/bin/env bash
# Every ablation sweep at mini scale (the embedded data, seeds 0, 1, 2 per classification cell), one after
# another, then the tables and the README's findings table. Resumable: run dirs are named after their
# overrides, so running it again skips finished jobs (they only re-test) and resumes unfinished ones from
# their last checkpoint; stop it at any time and run it again later.
# About 6 hours on 2 CPU cores (150 classification runs of ~1.5 min, 9 DETR runs of 10-20 min, 6 cost runs).
# Usage: bash scripts/mini_sweeps.sh [sweep ...]   (e.g. `where shared_head`; default: all of them)
# Results: runs/sweeps/<sweep>_mini/*; tables: docs/ablations_mini.{md,csv,tex}; README: the findings table.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
sweeps=("$@")
[ ${#sweeps[@]} -gt 0 ] || sweeps=(where method_mode shared_head index buckets compare swin cost detr)
status=0
for sweep in "${sweeps[@]}"; do
  echo "=== sweep=${sweep}_mini ($(date +%H:%M:%S))"
  "$PY" train.py "sweep=${sweep}_mini" || { echo "sweep ${sweep}_mini had failed jobs (see above)"; status=1; }
done
"$PY" scripts/make_tables.py runs/sweeps/*_mini --out docs/ablations_mini --readme README.md || status=1
exit $status
