#!/usr/bin/env bash
# Every ablation sweep at mini scale (the embedded data, seeds 0, 1, 2 per classification cell), one after
# another, then the tables and the README's findings table. Resumable: run dirs are named after their
# overrides, so running it again skips finished jobs (they only re-test) and resumes unfinished ones from
# their last checkpoint; stop it at any time and run it again later. After each sweep the results of its
# ended runs go into docs/ablations_mini_runs/ (scripts/archive_runs.py: configs and metrics, no
# checkpoints), which is committed; the tables are built from there, so sittings on different machines add up.
# 144 DeiT and 9 micro-Swin classification runs, 6 short cost runs and 27 DETR runs (nine rows, seeds 0-2).
# Measured on 2 CPU cores with two sweeps side by side (OMP_NUM_THREADS=1 each): a classification run
# finished about every 0.8 min, so those tables take about 2 hours; each lane took 10-12 min per 12-epoch
# DETR run, and a 24-epoch run took 38 min with a test suite running beside the two lanes (about twice a
# short run without it, not measured), so the 27 DETR runs take roughly 3 hours more (estimated).
# Usage: bash scripts/mini_sweeps.sh [sweep ...|all]   (e.g. `where shared_head`; default, or all: all of them)
# Runs: runs/sweeps/<sweep>_mini/*; their results: docs/ablations_mini_runs/<sweep>_mini/*;
# tables: docs/ablations_mini.{md,csv,tex}; README: the findings table.
# bash's own features follow (arrays, pipefail): under sh (dash) they would fail on dash's words, not ours
if [ -z "${BASH_VERSION:-}" ]; then
  echo "error: $0 is a bash script; valid: bash $0 ..." >&2
  exit 2
fi
set -uo pipefail
# PY: the project's Python (default .venv/bin/python of the repo; a relative path is read from the folder the
# script is started in). TRAINER: train.py overrides for every job, words of key=value (default: as below). Every
# setting and sweep name (scripts/script_checks.sh) is checked before any job starts, the TRAINER words by
# train.py's own checks of every sweep's jobs: a bad one is one line naming it and the valid choices, exit 2. A
# sweep named twice runs once. A sweep whose train.py ended without every job of its grid finished is exit 1.
# The checks beside the real script (started through a link too), read before anything else: without them nothing
# would be checked.
checks="$(dirname "$(readlink -f "$0")")/script_checks.sh"
# shellcheck source=scripts/script_checks.sh
if [ ! -r "$checks" ] || ! . "$checks"; then
  echo "error: $checks cannot be read, and without it no setting is checked; valid: run the script of a whole" \
    "checkout (bash <repo>/scripts/$(basename "$0"))" >&2
  exit 2
fi
caller_py
cd "$(dirname "$checks")/.." || usage_error "cannot change into the repo root $(dirname "$checks")/.."
check_names sweep "a mini sweep" all "where method_mode shared_head index buckets compare swin cost detr" "$@"
sweeps=("${names[@]}")
PY=${PY:-.venv/bin/python}
check_python
# On a machine with a GPU the jobs run there, in float32 like on a CPU (the micro models are tiny). The
# trainer is not part of a job's dir name, so a sweep started on one device is finished on the same kind:
# a job dir holding a run on the other device stops that job with one line.
check_trainer
commands=()
for sweep in "${sweeps[@]}"; do commands+=("sweep=${sweep}_mini"); done
check_jobs "${commands[@]}"
status=0
for sweep in "${sweeps[@]}"; do
  echo "=== sweep=${sweep}_mini ($(date +%H:%M:%S))"
  if ! run_child "$PY" train.py "sweep=${sweep}_mini" "${trainer[@]}"; then
    echo "sweep ${sweep}_mini had failed jobs (see above)"
    status=1
  elif ! sweep_finished "runs/sweeps/${sweep}_mini"; then
    status=1
  fi
  if [ -d "runs/sweeps/${sweep}_mini" ]; then
    "$PY" scripts/archive_runs.py "runs/sweeps/${sweep}_mini" --to docs/ablations_mini_runs || status=1
  fi
done
# The README's findings are one Holm family over the ablations and the benchmark tasks
# (scripts/benchmark_tasks.sh): both are judged together here too, so no task's findings leave the README.
mapfile -t benchmarks < <(benchmark_archives)
family=()
[ ${#benchmarks[@]} -gt 0 ] && family=(--family "${benchmarks[@]}")
"$PY" scripts/make_tables.py docs/ablations_mini_runs/*_mini --out docs/ablations_mini "${family[@]}" || status=1
"$PY" scripts/make_tables.py docs/ablations_mini_runs/*_mini "${benchmarks[@]}" --readme README.md > /dev/null \
  || status=1
exit $status
