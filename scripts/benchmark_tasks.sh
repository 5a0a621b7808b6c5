#!/usr/bin/env bash
# The benchmark tasks (docs/design.md, "Benchmark tasks"): for each task, its training sweep, then every
# finished run on the task's test sets (scripts/evaluate_testsets.py), then the runs' results into the
# committed archive. Resumable like scripts/mini_sweeps.sh: run dirs are named after their overrides, so
# running it again skips finished jobs and evaluations and resumes unfinished jobs from their last
# checkpoint. Exit 1 when a job or an evaluation did not finish (run it again to finish them).
# Usage: bash scripts/benchmark_tasks.sh [task ...|all]   (default, or all: every task, in this order)
#   shift       sweep=shift_mini: trained in the left half; tested on fresh left-half images, the right half,
#               everywhere
#   shift_swin  sweep=shift_swin_mini: the shift task on a micro Swin (no RPE, Swin's bias, iRPE-K, iRPE-QKV)
#   shift_buckets  sweep=shift_buckets_mini: the shift task with iRPE-K at 9, 25, 49 and 121 buckets (float32)
#   canvas      sweep=canvas_mini: the distance label trained at 32 px; tested on fresh 32 px images and on 48
#               and 64 px canvases (the sin-cos APE rows both resized and rebuilt at the new positions)
#   canvas_direction  sweep=canvas_direction_mini: the same with the direction label (float32)
#   longrange   sweep=longrange_mini: distance in bins of 2 patches on a 16x16 token grid; clip against
#               piecewise and the bucket counts of iRPE-K; tested on fresh images
# Runs: runs/sweeps/<task>_mini/*; results: docs/benchmark_runs/<task>_mini/*; then the tables
# (docs/benchmark_<task>.md), plots (docs/plots/benchmark_<task>.png) and the README's findings are rebuilt, with
# Table 6 on a GPU where its runs are archived (docs/benchmark_runs/detr_gpu, from scripts/gpu_checks.sh table6).
# LANES (default: the CPU count, at most 4) training processes share a task's seeds (lane i: seeds i,
# i+LANES, ...); each run uses one thread (experiment=benchmark_mini), so the lanes do not change results.
# SEED_COUNT (default: every seed of each task's sweep config, 12): only the first SEED_COUNT seeds, e.g. to time the
# benchmark at 10 seeds; such a benchmark is trained and evaluated but never archived (the archive holds whole tasks).
# PROGRESS_S (default 300): while a task trains or is evaluated, every PROGRESS_S seconds one line with its finished
# jobs (or test-set results written) and the time left at this sitting's pace (a CPU whose bf16 matrix products
# run on ATen's own kernel, without AVX-512, trains the recipe's bf16 steps 11-13 times slower than one with
# AVX-512: docs/benchmarks.md).
# PY: the project's Python (default .venv/bin/python of the repo, which `make test` or `make train` sets up; a
# relative path is read from the folder the script is started in).
# TRAINER: train.py overrides for every job, words of key=value (default: trainer=gpu in float32 where torch sees
# a GPU, else none: the CPU); e.g. TRAINER= for the CPU on a GPU machine.
# Every setting and task name (scripts/script_checks.sh) is checked before any dir is made or any job starts, the
# TRAINER words by train.py's own checks of each task's jobs: a bad one is one line naming it and the valid choices,
# exit 2. A task named twice runs once.
# A task whose sweep had failed jobs, or whose grid has a job without a finished run after its lanes ended, is
# neither evaluated nor archived (exit 1; run it again to finish them); the tables are rebuilt when some task was
# archived.
# bash's own features follow (arrays, pipefail): under sh (dash) they would fail on dash's words, not ours
if [ -z "${BASH_VERSION:-}" ]; then
  echo "error: $0 is a bash script; valid: bash $0 ..." >&2
  exit 2
fi
set -uo pipefail
# the checks beside the real script (started through a link too), read before anything else: without them nothing
# would be checked
checks="$(dirname "$(readlink -f "$0")")/script_checks.sh"
# shellcheck source=scripts/script_checks.sh
if [ ! -r "$checks" ] || ! . "$checks"; then
  echo "error: $checks cannot be read, and without it no setting is checked; valid: run the script of a whole" \
    "checkout (bash <repo>/scripts/$(basename "$0"))" >&2
  exit 2
fi
caller_py
cd "$(dirname "$checks")/.." || usage_error "cannot change into the repo root $(dirname "$checks")/.."
check_names task "a benchmark task" all "shift shift_swin shift_buckets canvas canvas_direction longrange" "$@"
tasks=("${names[@]}")
if [ -n "${LANES:-}" ]; then  # the user's count is taken as given; the default is capped at 4
  [[ "$LANES" =~ ^[1-9][0-9]*$ ]] || usage_error "LANES='$LANES' is not a positive integer; valid: 1, 2, ..." \
    "(the training processes that share a task's seeds; default: the CPU count, at most 4)"
else
  LANES=$(nproc 2>/dev/null || echo 1)
  [ "$LANES" -le 4 ] || LANES=4
fi
PROGRESS_S=${PROGRESS_S:-300}
[[ "$PROGRESS_S" =~ ^[1-9][0-9]*$ ]] || usage_error "PROGRESS_S='$PROGRESS_S' is not a positive integer; valid: 1, 2," \
  "... (seconds between two progress lines of a task's training or evaluation; default 300)"
if [ -n "${SEED_COUNT:-}" ]; then
  [[ "$SEED_COUNT" =~ ^[1-9][0-9]*$ ]] || usage_error "SEED_COUNT='$SEED_COUNT' is not a positive integer; valid: 1," \
    "2, ... up to a task's seeds (the first seeds of each task; default: all of them)"
fi
PY=${PY:-.venv/bin/python}
check_python
check_trainer
# each task's seeds (its sweep config's), then train.py's checks of every task's jobs, before any dir or lane
declare -A SEEDS=() ROWS=()
commands=()
for task in "${tasks[@]}"; do
  SEEDS[$task]=$("$PY" -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))['hydra']['sweeper']['params']['seed'])" \
    "configs/sweep/${task}_mini.yaml") || exit 2
  # the rows per seed, for the progress lines (a sweep without a row axis has one job per seed)
  ROWS[$task]=$("$PY" -c "import sys, yaml
row = yaml.safe_load(open(sys.argv[1]))['hydra']['sweeper']['params'].get('row')
print(1 if row is None else len(str(row).split(',')))" "configs/sweep/${task}_mini.yaml") || exit 2
  if [ -n "${SEED_COUNT:-}" ]; then
    IFS=, read -r -a listed <<< "${SEEDS[$task]}"
    [ "$SEED_COUNT" -le ${#listed[@]} ] || usage_error "SEED_COUNT=$SEED_COUNT is more than task $task's" \
      "${#listed[@]} seeds; valid: 1 to ${#listed[@]}"
    SEEDS[$task]=$(IFS=,; echo "${listed[*]:0:$SEED_COUNT}")
  fi
  commands+=("sweep=${task}_mini seed=${SEEDS[$task]}")
done
check_jobs "${commands[@]}"
mkdir -p runs
declare -A TESTSETS=(
  [shift]="relational_left relational_right relational_everywhere"
  [shift_swin]="relational_left relational_right relational_everywhere"
  [shift_buckets]="relational_left relational_right relational_everywhere"
  [longrange]="relational_longrange"
  [canvas]="relational_distance relational_distance_canvas48 relational_distance_canvas64"
  [canvas_direction]="relational_everywhere relational_canvas48 relational_canvas64"
)
# runs also evaluated with the sin-cos table rebuilt at the new positions (ape=extend), by run-dir glob
declare -A EXTEND=(
  [canvas]="row=ape_sincos,*"
  [canvas_direction]="row=ape_sincos,*"
)
# chance top-1 of each task's labels, and the rows its plot draws (the references and one of each family)
declare -A CHANCE=([shift]=12.5 [shift_swin]=12.5 [shift_buckets]=12.5 [canvas]=25 [canvas_direction]=12.5 [longrange]=20)
declare -A PLOT_ROWS=(
  [shift]="none ape_learned ape_sincos cpvt product_ctx product_bias irpe_qkv shaw huang xl rope_axial rope_mixed cpb t5"
  [canvas]="none ape_learned ape_sincos cpvt product_ctx irpe_qkv shaw huang rope_axial rope_mixed cpb t5"
  [shift_swin]="none swin irpe_k irpe_qkv"
  [shift_buckets]="buckets_9 buckets_25 buckets_49 buckets_121"
  [canvas_direction]="none ape_learned ape_sincos product_ctx rope_axial rope_mixed"
  [longrange]="clip_r2 buckets_9 buckets_49 buckets_81 buckets_121"
)
# finished_jobs SWEEP SEED...: how many run dirs of those seeds in the sweep's dir finished training
finished_jobs() {
  local sweep=$1 seed run count=0
  shift
  for seed in "$@"; do
    for run in "runs/sweeps/$sweep"/*seed="$seed"; do
      grep -qs '"state": "finished"' "$run/run.json" && count=$((count + 1))
    done
  done
  echo "$count"
}
# results_written SWEEP SEED...: how many test-set results the run dirs of those seeds hold (results set aside as
# stale, in a folder of their own, are not counted)
results_written() {
  local sweep=$1 seed result count=0
  shift
  for seed in "$@"; do
    for result in "runs/sweeps/$sweep"/*seed="$seed"/testsets/*.json; do
      [ -f "$result" ] && count=$((count + 1))
    done
  done
  echo "$count"
}
# minutes SECONDS: "X h Y min" or "Y min", rounded up
minutes() {
  local m=$(( ($1 + 59) / 60 ))
  if [ "$m" -ge 60 ]; then echo "$((m / 60)) h $((m % 60)) min"; else echo "$m min"; fi
}
# show_progress PHASE WHAT TOTAL COUNTER ARG...: until every lane (pids) has ended, one line every PROGRESS_S
# seconds: what COUNTER ARG... counts of TOTAL (e.g. "jobs finished"), and the time PHASE (training, evaluation) has
# left at this sitting's pace, from the phase's start (phase_start) and the count then (count_before: a resumed
# task's earlier work is not pace).
show_progress() {
  local phase=$1 what=$2 total=$3 pid alive now done_here elapsed left last=$SECONDS
  shift 3
  while :; do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive -eq 1 ] || break
    sleep 1 & wait $!
    [ $((SECONDS - last)) -ge "$PROGRESS_S" ] || continue
    last=$SECONDS
    now=$("$@")
    done_here=$((now - count_before))
    elapsed=$((SECONDS - phase_start))
    left=$((total - now))
    [ "$left" -ge 0 ] || left=0
    if [ "$done_here" -gt 0 ]; then
      echo "$sweep: $now of $total $what ($done_here in this sitting's $((elapsed / 60)) min $((elapsed % 60)) s);" \
        "about $(minutes $((left * elapsed / done_here))) of $phase left at this pace ($(date +%H:%M:%S))"
    else
      echo "$sweep: $now of $total $what; none yet in this sitting's $((elapsed / 60)) min $((elapsed % 60)) s" \
        "($(date +%H:%M:%S))"
    fi
  done
}
status=0
archived=0
for task in "${tasks[@]}"; do  # each name checked above, before anything ran
  sweep="${task}_mini"
  echo "=== $sweep ($(date +%H:%M:%S))"
  started=$SECONDS
  # the sweep's seeds, split over the lanes; a lane starts after the one before it has written its grid
  IFS=, read -r -a all_seeds <<< "${SEEDS[$task]}"
  phase_start=$started
  count_before=$(finished_jobs "$sweep" "${all_seeds[@]}")
  pids=()
  for ((lane = 0; lane < LANES && lane < ${#all_seeds[@]}; lane++)); do
    mine=$(for ((i = lane; i < ${#all_seeds[@]}; i += LANES)); do printf '%s,' "${all_seeds[$i]}"; done)
    "$PY" train.py "sweep=$sweep" "seed=${mine%,}" "${trainer[@]}" > "runs/$sweep.lane$lane.log" 2>&1 &
    pids+=($!)
    children+=($!)
    echo "lane $lane: seeds ${mine%,} (log runs/$sweep.lane$lane.log)"
    # Hydra writes the launch's grid (multirun.yaml) before it prints "Launching"; the next lane keeps it
    for _ in $(seq 240); do
      grep -q "Launching" "runs/$sweep.lane$lane.log" 2>/dev/null || ! kill -0 "${pids[-1]}" 2>/dev/null && break
      sleep 0.5
    done
  done
  show_progress training "jobs finished" $(( ${#all_seeds[@]} * ROWS[$task] )) finished_jobs "$sweep" "${all_seeds[@]}"
  failed=0
  for pid in "${pids[@]}"; do
    wait "$pid" || failed=1
  done
  trained=$SECONDS
  echo "$sweep: training took $(( (trained - started) / 60 )) min $(( (trained - started) % 60 )) s"
  if [ $failed -eq 1 ]; then
    echo "sweep $sweep had failed jobs (see its lane logs): not evaluated or archived; run it again to finish them"
    status=1
  elif ! sweep_finished "runs/sweeps/$sweep" "not evaluated or archived; run it again to finish it"; then
    status=1
  else
    [ -n "${SEED_COUNT:-}" ] || archived=1  # the tables are rebuilt when a whole task was archived
    # the evaluations in the same lanes, one thread each: two processes of two threads on two cores spend
    # more time waiting on each other than computing; no throughput is timed (no table reads it, and it
    # would add a fifth to each evaluation)
    pids=()
    phase_start=$SECONDS
    count_before=$(results_written "$sweep" "${all_seeds[@]}")
    evaluations=0  # each run on each test set, and the rebuilt-table runs (EXTEND) once more
    read -r -a testsets <<< "${TESTSETS[$task]}"
    for ((lane = 0; lane < LANES && lane < ${#all_seeds[@]}; lane++)); do
      mine=()
      for ((i = lane; i < ${#all_seeds[@]}; i += LANES)); do
        for run in "runs/sweeps/$sweep"/*seed="${all_seeds[$i]}"; do [ -d "$run" ] && mine+=("$run"); done
      done
      [ ${#mine[@]} -gt 0 ] || continue
      for run in "${mine[@]}"; do
        evaluations=$((evaluations + ${#testsets[@]}))
        # shellcheck disable=SC2053  # the pattern is a glob
        [ -n "${EXTEND[$task]+x}" ] && [[ "$(basename "$run")" == ${EXTEND[$task]} ]] \
          && evaluations=$((evaluations + ${#testsets[@]}))
      done
      (
        # shellcheck disable=SC2086  # the test set names are words
        OMP_NUM_THREADS=1 "$PY" scripts/evaluate_testsets.py "${mine[@]}" --testsets ${TESTSETS[$task]} \
          --set throughput_batch=null || exit 1
        if [ -n "${EXTEND[$task]+x}" ]; then
          extend=()
          for run in "${mine[@]}"; do
            # shellcheck disable=SC2053  # the pattern is a glob
            [[ "$(basename "$run")" == ${EXTEND[$task]} ]] && extend+=("$run")
          done
          [ ${#extend[@]} -eq 0 ] || OMP_NUM_THREADS=1 "$PY" scripts/evaluate_testsets.py "${extend[@]}" \
            --testsets ${TESTSETS[$task]} --ape extend --set throughput_batch=null || exit 1
        fi
      ) > "runs/$sweep.eval$lane.log" 2>&1 &
      pids+=($!)
      children+=($!)
      echo "evaluation lane $lane (log runs/$sweep.eval$lane.log)"
    done
    show_progress evaluation "test-set results written" "$evaluations" results_written "$sweep" "${all_seeds[@]}"
    for pid in "${pids[@]}"; do
      wait "$pid" || { echo "evaluations of $sweep were not all done (see its evaluation logs)"; status=1; }
    done
    echo "$sweep: evaluation took $(( (SECONDS - trained) / 60 )) min $(( (SECONDS - trained) % 60 )) s"
    if [ -n "${SEED_COUNT:-}" ]; then
      echo "$sweep: not archived (SEED_COUNT=$SEED_COUNT: the archive holds whole tasks)"
    else
      "$PY" scripts/archive_runs.py "runs/sweeps/$sweep" --to docs/benchmark_runs || status=1
    fi
  fi
done
# the task tables, their plots and the README's findings, from the committed archives: every task's
# findings are one Holm family, so each table is judged together with the others
if [ $archived -eq 0 ]; then
  echo "no task was archived: the tables, plots and README findings are left as they are"
  exit $status
fi
mapfile -t ablations < <(ls -d docs/ablations_mini_runs/*_mini)
mapfile -t benchmarks < <(benchmark_archives)  # with Table 6's on a GPU once archived
for archive in "${benchmarks[@]}"; do
  task=$(basename "$archive" _mini)
  others=("${ablations[@]}")
  for b in "${benchmarks[@]}"; do [ "$b" = "$archive" ] || others+=("$b"); done
  "$PY" scripts/make_tables.py "$archive" --out "docs/benchmark_$task" --family "${others[@]}" || status=1
  [ -n "${PLOT_ROWS[$task]+x}" ] || continue  # a plot of each CPU task's top-1
  "$PY" scripts/plot_benchmark.py "docs/benchmark_$task.csv" --table "${task}_mini" --chance "${CHANCE[$task]}" \
    --rows ${PLOT_ROWS[$task]} --out "docs/plots/benchmark_$task.png" || status=1
done
"$PY" scripts/make_tables.py "${ablations[@]}" --out docs/ablations_mini --family "${benchmarks[@]}" || status=1
"$PY" scripts/make_tables.py "${ablations[@]}" "${benchmarks[@]}" --readme README.md > /dev/null || status=1
exit $status
