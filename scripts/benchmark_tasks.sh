#!/usr/bin/env bash
# The benchmark tasks (docs/design.md, "Benchmark tasks"): for each task, its training sweep, then every
# finished run on the task's test sets (scripts/evaluate_testsets.py), then the runs' results into the
# committed archive. Resumable like scripts/mini_sweeps.sh: run dirs are named after their overrides, so
# running it again skips finished jobs and evaluations and resumes unfinished jobs from their last
# checkpoint. Exit 1 when a job or an evaluation did not finish (run it again to finish them).
# Usage: bash scripts/benchmark_tasks.sh [task ...]   (default: every task)
#   shift   sweep=shift_mini: trained in the left half; tested on fresh left-half images, the right half, everywhere
# Runs: runs/sweeps/<task>_mini/*; results: docs/benchmark_runs/<task>_mini/*.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [ -z "${TRAINER+x}" ]; then
  TRAINER=$("$PY" -c "import torch; print('trainer=gpu trainer.precision=32-true' if torch.cuda.is_available() else '')")
fi
declare -A TESTSETS=(
  [shift]="relational_left relational_right relational_everywhere"
)
tasks=("$@")
[ ${#tasks[@]} -gt 0 ] || tasks=(shift)
status=0
for task in "${tasks[@]}"; do
  if [ -z "${TESTSETS[$task]+x}" ]; then
    echo "error: task '$task' is not a benchmark task; valid: ${!TESTSETS[*]}" >&2
    exit 2
  fi
  sweep="${task}_mini"
  echo "=== $sweep ($(date +%H:%M:%S))"
  "$PY" train.py "sweep=$sweep" $TRAINER || { echo "sweep $sweep had failed jobs (see above)"; status=1; }
  if [ -d "runs/sweeps/$sweep" ]; then
    # shellcheck disable=SC2086  # the test set names are words
    "$PY" scripts/evaluate_testsets.py "runs/sweeps/$sweep" --testsets ${TESTSETS[$task]} || status=1
    "$PY" scripts/archive_runs.py "runs/sweeps/$sweep" --to docs/benchmark_runs || status=1
  fi
done
exit $status
