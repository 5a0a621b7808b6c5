# shellcheck shell=bash
# The up-front checks of scripts/benchmark_tasks.sh and scripts/mini_sweeps.sh (sourced by both, from the repo
# root): a bad setting or name is one line naming it and the valid choices, exit 2, before any dir is made or any
# job starts.
usage_error() {
  echo "error: $*" >&2
  exit 2
}

# PY (default .venv/bin/python): an executable that imports torch, hydra and timm
check_python() {
  local hint="create the venv with 'make test' or 'make train' (either sets up .venv), or set PY=<a Python with the"
  hint+=" project installed>"
  command -v -- "$PY" > /dev/null \
    || usage_error "PY='$PY' is not an executable Python (no such file, or not executable); valid: $hint"
  "$PY" -c "import torch, hydra, timm" > /dev/null 2>&1 \
    || usage_error "PY='$PY' cannot import torch, hydra and timm (not the project's Python); valid: $hint"
}

# check_names LABEL KIND ALL VALID NAME...: the given names, each one of VALID exactly (compared whole, never as a part of the list), each once in
# the order given; `all` (where ALL is set) or none: every valid name. Sets the array `names`.
check_names() {
  local label=$1 kind=$2 all=$3 valid=$4
  shift 4
  local -A seen=()
  local name choice ok
  names=()
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
# one of configs/trainer; a GPU trainer only where torch sees a GPU (train.py would refuse every job). Unset: the
# GPU where torch sees one (in float32, like on a CPU), else the CPU. Sets the array `trainer`.
check_trainer() {
  local choices hint word key value gpu=0
  choices=$(cd configs/trainer 2>/dev/null && for f in [!_]*.yaml; do [ -e "$f" ] && printf '%s ' "${f%.yaml}"; done)
  hint="valid: TRAINER= (the CPU) or words of key=value overrides of train.py, e.g."
  hint+=" TRAINER='trainer=gpu trainer.precision=32-true'; trainer= one of: ${choices% }"
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
