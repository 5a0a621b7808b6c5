# shellcheck shell=bash
# The up-front checks of scripts/benchmark_tasks.sh and scripts/mini_sweeps.sh (sourced by both): a bad setting or
# name is one line naming it and the valid choices, exit 2, before any dir is made or any job starts; and the
# check that a sweep they ran finished, and the list of the benchmark archives. Each function but caller_py runs in
# the repo root.
# Run rather than sourced, it has nothing to do: say which scripts source it (its header with -h).
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  case ${1:-} in
    -h | --help) sed -n '2,5s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "error: $0 is sourced by scripts/benchmark_tasks.sh and scripts/mini_sweeps.sh, not run; valid: bash" \
      "scripts/benchmark_tasks.sh -h, or bash scripts/mini_sweeps.sh -h" >&2; exit 2 ;;
  esac
fi
usage_error() {
  echo "error: $*" >&2
  exit 2
}

# The script that sourced this file, resolved now: the scripts change into the repo root after sourcing it.
script_path=$(readlink -f "$0")

# The script's header comment (its usage, settings and outputs: every line above its check for bash), exit 0.
print_help() {
  sed -n '2,/^# bash.s own features follow/{/^# bash.s own features follow/d;s/^# \{0,1\}//p}' "$script_path"
  exit 0
}

# A PY given as a path relative to the folder the script was started in (../venv/bin/python) is made absolute,
# before the script changes into the repo root; a bare name (python3) stays a name looked up on PATH.
caller_py() {
  [[ -z "${PY:-}" || "$PY" != */* || "$PY" == /* ]] || PY="$PWD/$PY"
}

# PY (default .venv/bin/python): an executable that imports torch, hydra and timm. It must print what only those
# imports can (their module names): a program that succeeds at anything (/bin/true) would otherwise pass, and
# every sweep after it would "run" without a job.
check_python() {
  local hint="create the venv with 'make test' or 'make train' (either sets up .venv), or set PY=<a Python with the"
  hint+=" project installed>"
  local said
  command -v -- "$PY" > /dev/null \
    || usage_error "PY='$PY' is not an executable Python (no such file, or not executable); valid: $hint"
  # the temp dir first, with the standard library only: importing torch below makes its cache folder there
  local problem
  problem=$("$PY" -c "import starting; print(starting.temp_dir_problem() or '')" 2> /dev/null)
  [ -z "$problem" ] || usage_error "$problem"
  said=$("$PY" -c "import torch, hydra, timm; print(*(m.__name__ for m in (torch, hydra, timm)))" 2> /dev/null)
  [ "$said" = "torch hydra timm" ] \
    || usage_error "PY='$PY' cannot import torch, hydra and timm (not the project's Python); valid: $hint"
}

# check_names LABEL KIND ALL VALID NAME...: the given names, each one of VALID exactly (compared whole, never as a part of the list), each once in
# the order given; `all` (where ALL is set) or none: every valid name. Sets the array `names`. With -h or --help
# among them: the script's help (print_help).
check_names() {
  local label=$1 kind=$2 all=$3 valid=$4
  shift 4
  local -A seen=()
  local name choice ok
  names=()
  for name in "$@"; do
    case $name in -h | --help) print_help ;; esac
  done
  for name in "$@"; do
    ok=0
    for choice in $valid ${all:+all}; do [ "$name" = "$choice" ] && ok=1; done
    [ $ok -eq 1 ] || usage_error "$label '$name' is not $kind; valid: $valid${all:+ (or all)}, one name an argument"
    [ -n "${seen[$name]+x}" ] || names+=("$name")
    seen[$name]=1
  done
  if [ ${#names[@]} -eq 0 ] || [ -n "${seen[all]+x}" ]; then
    read -r -a names <<< "$valid"
  fi
}

# TRAINER: words of Hydra overrides (key=value, +key=value, ~key), split on spaces and never globbed; trainer=<name>
# one of configs/trainer; a GPU trainer only where torch sees a GPU (train.py would refuse every job); never the
# keys the scripts set for each sweep (sweep, seed), which would replace a sweep's own, nor where the jobs write
# (hydra.*, paths.*, run_name), which the scripts read back. Unset: the GPU where torch
# sees one (in float32, like on a CPU), else the CPU. Sets the array `trainer`. The values themselves are
# train.py's to judge (check_jobs).
trainer_hint() {
  local choices
  choices=$(cd configs/trainer 2>/dev/null && for f in [!_]*.yaml; do [ -e "$f" ] && printf '%s ' "${f%.yaml}"; done)
  echo "valid: TRAINER= (the CPU) or words of key=value overrides of train.py, e.g." \
    "TRAINER='trainer=gpu trainer.precision=32-true'; trainer= one of: ${choices% }"
}

check_trainer() {
  local choices hint word key value gpu=0
  choices=$(cd configs/trainer 2>/dev/null && for f in [!_]*.yaml; do [ -e "$f" ] && printf '%s ' "${f%.yaml}"; done)
  hint=$(trainer_hint)
  if [ -z "${TRAINER+x}" ]; then
    TRAINER=$("$PY" -c "import torch; print('trainer=gpu trainer.precision=32-true' if torch.cuda.is_available() else '')") \
      || usage_error "PY='$PY' could not tell whether a GPU is there; set TRAINER= (CPU) or TRAINER='trainer=gpu'"
  fi
  [[ "$TRAINER" != *$'\n'* ]] || usage_error "TRAINER holds a line break; $hint"
  read -r -a trainer <<< "$TRAINER"
  for word in "${trainer[@]}"; do
    [[ "$word" =~ ^(\+{1,2}|~)?[A-Za-z_][A-Za-z0-9_./@-]*=. || "$word" =~ ^~[A-Za-z_][A-Za-z0-9_./@-]*$ ]] \
      || usage_error "TRAINER='$TRAINER': '$word' is not a key=value override; $hint"
    key=${word%%=*}
    key=${key#"${key%%[!+~]*}"}
    value=${word#*=}
    [[ "$key" != sweep && "$key" != seed ]] \
      || usage_error "TRAINER='$TRAINER': $key is set by the script for each sweep (its sweep config and seeds), and" \
        "$word would replace it; $hint"
    [[ "$key" != hydra.run* && "$key" != hydra.sweep* && "$key" != paths && "$key" != paths[./]* \
       && "$key" != run_name ]] \
      || usage_error "TRAINER='$TRAINER': $key decides where the jobs write, and the script evaluates and archives" \
        "its sweeps where it puts them (runs/sweeps/<task>_mini), so $word would send them elsewhere; $hint"
    [[ "$key" != hydra && "$key" != hydra[./]* ]] \
      || usage_error "TRAINER='$TRAINER': $key is a setting of Hydra's own, which the script keeps as the project" \
        "sets it (it launches, evaluates and archives each sweep itself); $hint"
    if [ "$key" = trainer ] && [[ "$word" == *=* ]]; then
      [[ " $choices " == *" $value "* ]] || usage_error "TRAINER='$TRAINER': trainer=$value is not a trainer; $hint"
      [[ "$value" == gpu || "$value" == ddp ]] && gpu=1
    fi
    [[ "$key" == trainer.accelerator && ( "$value" == gpu || "$value" == cuda ) ]] && gpu=1
  done
  if [ $gpu -eq 1 ] && [ "$("$PY" -c "import torch; print(torch.cuda.is_available())" 2>/dev/null)" != True ]; then
    usage_error "TRAINER='$TRAINER' asks for a GPU, and PY='$PY' sees none (torch.cuda.is_available() is not True);" \
      "valid here: TRAINER= (the CPU), or trainer=cpu"
  fi
}

# check_jobs WORDS...: train.py's own command-line checks (`train.py --check`, which writes nothing) on the job
# command of each WORDS (the script's own key=value words, split on spaces) with the TRAINER words, all in one
# process: a value train.py refuses (trainer.precision=bogus, an accelerator not here) is its one line, exit 2,
# before any dir or job, not a failed job in every sweep.
check_jobs() {
  local words own args=() said
  for words in "$@"; do
    read -r -a own <<< "$words"
    [ ${#args[@]} -eq 0 ] || args+=(--)
    args+=("${own[@]}" "${trainer[@]}")
  done
  if ! said=$("$PY" train.py --check "${args[@]}" 2>&1 > /dev/null); then
    said=${said##*$'\n'}  # its one line follows any warning
    [ -n "$said" ] || said="its check ended without a line"
    usage_error "train.py refuses the jobs (with TRAINER='$TRAINER'): ${said#error: }"
  fi
  check_sweep_dirs "$@"
}

# check_sweep_dirs WORDS...: the sweep dir of each job command (WORDS, the script's own key=value words) as the
# composed config resolves hydra.sweep.dir, with the TRAINER words and without: a word that moves it (sweep_name=,
# an experiment or a config group that sets a sweep's name or its dir) is one line naming it. The scripts test,
# evaluate and archive each sweep where its own words put it; a sweep written elsewhere would leave them reading
# an older sweep dir as this sitting's. Only PY's answer "same" passes.
check_sweep_dirs() {
  local words own said
  [ ${#trainer[@]} -gt 0 ] || return 0
  for words in "$@"; do
    read -r -a own <<< "$words"
    said=$("$PY" -c '
import os, re, sys
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

count = int(sys.argv[1])
trainer, own = sys.argv[2:2 + count], sys.argv[2 + count:]
command = " ".join(own)
# a time in the dir name is the same time for both readings
OmegaConf.register_new_resolver("now", lambda pattern: f"<now:{pattern}>", replace=True)


def as_train_py_reads(words):
    """+a.b=v sets or adds (as train.py reads it); a swept value is its first."""
    words = ["+" + w if re.match(r"\+[A-Za-z_][\w-]*(\.[\w-]+)+=", w) else w for w in words]
    single = []
    for override in OverridesParser.create().parse_overrides(words):
        if not override.is_sweep_override():
            single.append(override.input_line)
            continue
        try:
            single.append(f"{override.get_key_element()}={next(iter(override.sweep_string_iterator()))}")
        except Exception:  # an interval: a drawn number, never a dir name
            pass
    return single


def sweep_dir(words):
    with initialize_config_dir(os.path.abspath("configs"), version_base="1.3"):
        cfg = compose("train", overrides=as_train_py_reads(words), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return str(OmegaConf.select(cfg, "hydra.sweep.dir", throw_on_resolution_failure=True))


try:
    mine, theirs = sweep_dir(own), sweep_dir(own + trainer)
    if mine == theirs:
        print("same")
    else:
        moving = next((w for w in trainer if sweep_dir(own + [w]) != mine), "the words together")
        print(f"{moving} moves the sweep of {command} from {mine} to {theirs}")
except Exception as err:
    reason = str(err).splitlines()[0] if str(err).strip() else type(err).__name__
    print(f"the sweep dir of {command} with these words cannot be resolved: {reason}")
'  "${#trainer[@]}" "${trainer[@]}" "${own[@]}" 2>&1)
    said=${said##*$'\n'}  # the answer follows any warning
    [ "$said" = same ] && continue
    usage_error "TRAINER='$TRAINER': ${said:-PY printed no answer for the sweep dir}, and the script tests, evaluates" \
      "and archives each sweep where its own words put it; $(trainer_hint)"
  done
}

# sweep_finished DIR [WHAT]: whether every job the sweep in DIR asked for (the grids of its launches) has a finished
# run, read as the tables read it (reports/collect.py); else one line saying which did not (and WHAT), on
# stdout. Only PY's answer "finished" counts: a PY that prints nothing or crashes ran no sweep.
sweep_finished() {
  local said
  [ -d "$1" ] || { echo "sweep $1 did not finish: train.py made no sweep dir${2:+; $2}"; return 1; }
  said=$("$PY" -c '
import sys
from reports.collect import TableError, collect
try:
    runs = collect(sys.argv[1:])
except TableError as err:
    print(err)
else:
    left = [run for run in runs if run.status != "ok"]
    print(f"{len(left)} of its {len(runs)} jobs did not finish, e.g. {left[0].path} ({left[0].status})" if left
          else "finished")
' "$1" 2>&1)
  said=${said##*$'\n'}  # the answer follows any warning
  [ "$said" = finished ] && return 0
  echo "sweep $1 did not finish: ${said:-PY printed no answer}${2:+; $2}"
  return 1
}

# benchmark_archives: the committed archives of the benchmark tasks, one per line, in the repo root: each CPU
# task's (docs/benchmark_runs/<task>_mini) and Table 6's on a GPU once archived (docs/benchmark_runs/detr_gpu, from
# scripts/gpu_checks.sh table6). The README's findings are one Holm family over these and the mini ablations, so
# both scripts rebuild it from this one list: a script that left one out would judge the others in a smaller family.
benchmark_archives() {
  local archive
  for archive in docs/benchmark_runs/*_mini docs/benchmark_runs/detr_gpu; do
    [ ! -d "$archive" ] || echo "$archive"
  done
}

# The processes this script started (training lanes, evaluations, a sweep): a stop signal to the script (Ctrl-C,
# SIGTERM from a scheduler, a closed terminal) is passed on to each, which saves its run at the next batch and
# records it interrupted; the script waits for them, says so in one line and exits 128 + the signal's number.
# Without this the children lived on after the script had ended.
# SIGINT is passed on as SIGTERM: a child started with & by a non-interactive bash (no job control) has SIGINT
# ignored from its start, which no trap or handler of its own can undo, so SIGINT would never reach it and the
# script would wait for the lanes to finish. SIGTERM is a stop signal of every child (train.py, evaluate_testsets).
children=()
stop_children() {
  trap - TERM INT HUP
  local pid passed=$1
  [ "$passed" != INT ] || passed=TERM
  for pid in "${children[@]}"; do  # a lane of evaluations is a subshell: its own child gets the signal too
    pkill -"$passed" -P "$pid" 2>/dev/null
    kill -"$passed" "$pid" 2>/dev/null
  done
  wait
  echo "error: stopped by SIG$1; the runs in progress saved their state: run the same command again to go on" >&2
  exit "$2"
}
trap 'stop_children TERM 143' TERM
trap 'stop_children INT 130' INT
trap 'stop_children HUP 129' HUP

# run_child CMD...: CMD as a child the stop signals reach (`stop_children`); its exit status.
run_child() {
  "$@" &
  children+=($!)
  wait $!
}
