#!/usr/bin/env bash
# The GPU-only checks in one prepared run (for a leased H200 through the device tool, or any CUDA box),
# most important first, each under its own timeout so that a slow step cannot eat the others:
#   0. the fused Triton kernel (rpe.backend=triton, opt-in): its CUDA tests (bf16 error against float64
#      vs the eager path's, printed timings), then DeiT-S and Swin-T step time and memory with @triton
#   1. bf16 training-step time and memory of DeiT-S with each RPE preset and backend vs timm's plain model,
#      then one attention layer piece by piece (scripts/profile_attention.py)
#   2. rpe on CUDA: sdpa/eager/compiled-flex parity, forward and backward, plus per-backend attention timings
#   3. FlexAttention training end to end: the default experiment (`make train`) on the GPU, backend=flex
#      and backend=auto, bf16-mixed
#   4. bf16 Swin-T with each preset vs timm's plain Swin-T
# The step timeouts add up to 550 s, so that the whole script fits one device call of at most 600 s.
#   T. (optional, a device call of its own: `bash scripts/gpu_checks.sh table6 [override ...]` runs only this
#      step, its training under a 450 s timeout and its evaluation under 100 s) paper Table 6 (DETR) at the
#      size that decides it: sweep=detr_gpu, its three rows x seeds 0-11 on a 16x16+ token grid, each run then
#      evaluated on 1000 fresh images (shapes_coco_fresh), which its pre-registered findings read
#      (findings/detr_gpu.yaml); see table6_step below
# Results go to $OUT (default ./gpu_out). Packages missing on the box can be carried as wheels in .whl/.
# bash's own features follow (arrays, pipefail): under sh (dash) they would fail on dash's words, not ours
if [ -z "${BASH_VERSION:-}" ]; then
  echo "error: $0 is a bash script; valid: bash $0 ..." >&2
  exit 2
fi
set -u
if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then  # the header above, as the other scripts print theirs
  sed -n '2,/^# bash.s own features follow/{/^# bash.s own features follow/d;s/^# \{0,1\}//p}' "$0"
  exit 0
fi
if [ $# -gt 0 ] && [ "$1" != table6 ]; then
  echo "error: '$1' is not a step of gpu_checks.sh; valid: table6 (then train.py overrides), -h for help, or nothing for the default checks" >&2
  exit 2
fi
OUT=${OUT:-gpu_out}
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
# every step runs the project with python3: one that cannot import it is one line here, not a traceback per step
said=$(python3 -c "import torch, hydra, timm, lightning; print(*(m.__name__ for m in (torch, hydra, timm, lightning)))" \
  2> /dev/null)
if [ "$said" != "torch hydra timm lightning" ]; then
  echo "error: python3 ($(command -v python3 || echo 'not found')) cannot import torch, hydra, timm and lightning;" \
    "valid: a python3 with the project installed first on PATH (e.g. PATH=\$PWD/.venv/bin:\$PATH), or its wheels in .whl/" >&2
  exit 2
fi
# OUT is judged by the project's one rule for destinations (never inside a run dir or a data root) before
# anything is written into it
python3 - "$OUT" <<'PY' || exit 2
import sys

from storage.destinations import DestinationError, check_destination

try:
    check_destination(sys.argv[1], "OUT")
except (DestinationError, OSError) as err:
    sys.exit(f"error: {err}")
PY
mkdir -p "$OUT"
started=$(date +%s)
stamp() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/timeline.txt"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, timm, lightning; print('torch', torch.__version__, 'timm', timm.__version__,
'lightning', lightning.__version__)" >> "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

# T. Table 6 (DETR), sweep=detr_gpu (its config says what it changes from detr_mini and why): 3 rows x 12 seeds,
# 6 epochs of 2000 images at batch 16 (750 steps a run), each run tested once on its 1000 val images, then
# evaluated on the 1000 fresh images of shapes_coco_fresh. One lane per
# seed (TABLE6_LANES, default 12): a lane is one train.py multirun over its seeds' rows, so twelve small runs
# share the GPU at a time (each run alone leaves it idle most of a step, launching kernels from one CPU core)
# and the 16 cores (one intra-op thread and two loader workers a run). The data is generated once first.
# Time, estimated on CPU (no GPU has run this yet). A step is about 2500 kernel launches, counted with a
# dispatch mode: forward 175, the set criterion 1844 (its two matcher calls 785 each, about 49 per image),
# backward 480, clipping and foreach AdamW about 20; plus 32 host syncs (a matcher's cost matrix goes to
# the CPU per image) and 49 GFLOP (a 144x192 batch). Host time per op on a busy 2-core EPYC: 15 us (the CPU path
# at 2x2 tokens), so with a launch about 20 us: ~50 ms a step in a lane. GPU time: 2500 launches x 2-4 us
# plus the FLOPs at 15-50 TFLOP/s, 6-13 ms a step, and without MPS the lanes' kernels take turns on the
# GPU: together the lanes make about 60-150 steps/s (central 90). 36 x 750 = 27000 steps: 180-450 s
# (central 300); plus data 15 s, lane start-up about 30 s (imports and CUDA, one lane after the one before
# wrote its grid), setup and a 1000-image test about 8 s a run (24 s a lane): about 250-520 s, central 370.
# The evaluation on the fresh images, one process a lane (3 runs each, about 8 s a run, plus imports and the
# test set's generation, once, before them): about 50 s. A timeout of 450 s for the training and 100 s for the
# evaluation keeps the step inside one device call of 600 s.
# The summary prints the measured steps/s, to size the next run (e.g. `table6 schedules.short.epochs=12
# schedules.short.lr_drop=10`). If the timeout cuts it short, the lanes are all in their last run, the ctx
# clip 9x9 row (seed-major order): the first contrast (ctx 9x9 minus none) still has every seed.
table6_lanes() {  # log dir, data dir, lanes, trainer, then train.py overrides; the step's body, under its timeout
  local log=$1 data=$2 lanes=$3 trainer=$4 gen=() arg list lane mine i pid status=0
  shift 4
  for arg in "$@"; do case $arg in data.*|paths.*) gen+=("$arg") ;; esac; done
  python3 - "$data" "${gen[@]}" <<'PY' || return 1
import sys

from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from lifecycle.project import CONFIG_DIR

with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
    cfg = compose("train", overrides=["sweep=detr_gpu", f"paths.data_dir={sys.argv[1]}", *sys.argv[2:]])
instantiate(cfg.data).prepare_data()  # the lanes would otherwise wait on each other's generation lock
print(f"data: {cfg.data.root}")
PY
  list=${TABLE6_SEEDS:-$(python3 -c "import yaml
print(yaml.safe_load(open('configs/sweep/detr_gpu.yaml'))['hydra']['sweeper']['params']['seed'])")} || return 1
  local seeds pids=()
  IFS=, read -r -a seeds <<< "$list"
  for ((lane = 0; lane < lanes && lane < ${#seeds[@]}; lane++)); do
    mine=$(for ((i = lane; i < ${#seeds[@]}; i += lanes)); do printf '%s,' "${seeds[$i]}"; done)
    OMP_NUM_THREADS=1 python3 train.py sweep=detr_gpu "$trainer" "seed=${mine%,}" "paths.data_dir=$data" \
      "paths.log_dir=$log" "$@" > "$log/lane$lane.log" 2>&1 &
    pids+=($!)
    echo "lane $lane: seeds ${mine%,}"
    # the next lane starts once this one wrote its grid (multirun.yaml), which Hydra does before "Launching"
    for _ in $(seq 240); do
      grep -q "Launching" "$log/lane$lane.log" 2>/dev/null || ! kill -0 "${pids[-1]}" 2>/dev/null && break
      sleep 0.5
    done
  done
  # at the timeout's SIGTERM the runs save last.ckpt and their record: wait for that, so the summary reads it
  trap 'echo "timeout: the lanes save their state and stop"' TERM
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  while [ -n "$(jobs -pr)" ]; do wait; done  # a signal ends a wait early (timeout sends two)
  return $status
}

table6_evaluate() {  # log dir, data dir, lanes, trainer, then evaluate_testsets.py --set words (TABLE6_EVAL)
  # every finished run on the fresh test set its registered findings read, the runs dealt to the lanes; the
  # test set's images are generated once first, so that the processes do not wait on each other's lock
  local log=$1 data=$2 lanes=$3 trainer=$4 lane i run pid status=0 pids=() mine
  shift 4
  local sets=("paths.data_dir=$data" "$@")
  python3 scripts/generate_testsets.py shapes_coco_fresh --set "${sets[@]}" > "$log/eval_data.log" 2>&1 \
    || { cat "$log/eval_data.log"; return 1; }
  local runs=()
  for run in "$log/sweeps/detr_gpu"/*/; do [ -f "$run/config.yaml" ] && runs+=("${run%/}"); done
  for ((lane = 0; lane < lanes && lane < ${#runs[@]}; lane++)); do
    mine=()
    for ((i = lane; i < ${#runs[@]}; i += lanes)); do mine+=("${runs[$i]}"); done
    # every test-set result is measured at 32-true, which trainer=gpu (bf16-mixed) would not give
    OMP_NUM_THREADS=1 python3 scripts/evaluate_testsets.py "${mine[@]}" --testsets shapes_coco_fresh \
      --set "$trainer" trainer.precision=32-true throughput_batch=null "${sets[@]}" > "$log/eval$lane.log" 2>&1 &
    pids+=($!)
  done
  trap 'echo "timeout: the evaluations stop"' TERM
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  return $status
}

# TABLE6_DIR (default /tmp/table6) holds runs/ and data/; TABLE6_SEEDS (e.g. 0,1) replaces the sweep's seeds;
# TABLE6_TRAINER=trainer=cpu tries the step's machinery on a CPU (with tiny overrides: data.generator.num_train=32
# data.generator.num_val=16 trainer.limit_train_batches=2 schedules.short.epochs=1 schedules.short.lr_drop=1 ...,
# and TABLE6_EVAL='testset.data.generator.num_val=16 testset.data.root=<a folder of its own>', words of the
# evaluation's --set, for a tiny test set, whose results the tables do not count: it is not the registered one).
table6_step() {  # train.py overrides
  local log=${TABLE6_DIR:-/tmp/table6}/runs data=${TABLE6_DIR:-/tmp/table6}/data t0 trained status evaluated
  # every check of train.py (settings, the data root and the sweep dir as destinations) before data are generated
  python3 train.py --check sweep=detr_gpu "${TABLE6_TRAINER:-trainer=gpu}" "paths.data_dir=$data" \
    "paths.log_dir=$log" "$@" || return 2
  mkdir -p "$log"
  stamp "T. Table 6 (DETR): sweep=detr_gpu, ${TABLE6_LANES:-12} lanes, under 450 s"
  t0=$(date +%s)
  export -f table6_lanes table6_evaluate
  # timeout signals its whole process group: every lane, run and loader worker
  timeout -k 20 450 bash -c 'table6_lanes "$@"' _ "$log" "$data" "${TABLE6_LANES:-12}" "${TABLE6_TRAINER:-trainer=gpu}" "$@"
  status=$?
  trained=$(( $(date +%s) - t0 ))  # the training's seconds, for its steps/s (the evaluation comes after)
  stamp "T. lanes ended (rc=$status; 124: the timeout)"
  [ "$status" -eq 0 ] || for f in "$log"/lane*.log; do echo "== $f"; grep -v -i warn "$f" | tail -3; done
  # shellcheck disable=SC2086  # TABLE6_EVAL is words of key=value
  timeout -k 10 100 bash -c 'table6_evaluate "$@"' _ "$log" "$data" "${TABLE6_LANES:-12}" "${TABLE6_TRAINER:-trainer=gpu}" \
    ${TABLE6_EVAL:-}
  evaluated=$?
  stamp "T. evaluations ended (rc=$evaluated; 124: the timeout)"
  [ "$evaluated" -eq 0 ] || { status=1; for f in "$log"/eval*.log; do echo "== $f"; grep -v -i warn "$f" | tail -3; done; }
  python3 - "$log/sweeps/detr_gpu" "$trained" <<'PY' 2>&1 | tee "$OUT/table6_summary.txt"
import glob, json, os, statistics, sys

import yaml

sweep, seconds = sys.argv[1], int(sys.argv[2])
if not os.path.isdir(sweep):
    sys.exit(f"no runs: {sweep} does not exist (the lane logs are in table6_runs.tar.gz)")
done, steps, times, other = {}, 0, [], []
for run in sorted(glob.glob(f"{sweep}/*/")):
    name = os.path.basename(run.rstrip("/"))
    metrics = json.load(open(f"{run}metrics.json")) if os.path.exists(f"{run}metrics.json") else {}
    if metrics.get("val/AP") is None:
        state = json.load(open(f"{run}run.json")).get("state") if os.path.exists(f"{run}run.json") else "no record"
        other.append(f"{name}: {state}")
        continue
    cfg = yaml.safe_load(open(f"{run}config.yaml"))
    fresh_file = f"{run}testsets/shapes_coco_fresh.json"
    fresh = json.load(open(fresh_file)).get("metrics", {}).get("val/AP") if os.path.exists(fresh_file) else None
    done.setdefault(cfg["row"], []).append((cfg["seed"], metrics["val/AP"], fresh))
    steps += metrics["global_step"]
    times.append(metrics["wall_time_s"])
print("Table 6 on the GPU (sweep=detr_gpu): val/AP of each run's last epoch on its 1000 val images, and on the"
      " 1000 fresh images of shapes_coco_fresh (which the registered findings read)")
def mean_sd(values):
    return f"{statistics.mean(values):6.2f}" + (f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else "")
for row, runs in done.items():
    fresh = [ap for _, _, ap in runs if ap is not None]
    print(f"  {row:22s} val {mean_sd([ap for _, ap, _ in runs])} (n={len(runs)}), fresh"
          f" {mean_sd(fresh) if fresh else 'none'} (n={len(fresh)}); seeds {' '.join(str(s) for s, *_ in sorted(runs))}")
print(f"not finished: {len(other)}" + "".join(f"\n  {line}" for line in other))
if times:
    print(f"throughput: {steps} steps of finished runs in the training's {seconds} s = {steps / max(seconds, 1):.0f}"
          f" steps/s over all lanes; a run took {min(times):.0f}-{max(times):.0f} s (median {statistics.median(times):.0f})")
PY
  # the table and its findings' tests, and the run records (no checkpoints, test-set results kept) to archive
  # here (scripts/archive_runs.py <them>/sweeps/detr_gpu --to docs/benchmark_runs): the verdicts of record are
  # those of the rebuild with every task's findings as one Holm family (scripts/benchmark_tasks.sh's last step,
  # which reads docs/benchmark_runs/detr_gpu too), not this table's alone
  python3 scripts/make_tables.py "$log/sweeps/detr_gpu" > "$OUT/table6_tables.md" 2>&1
  grep "^|.*detr_gpu\`" "$OUT/table6_tables.md" | head -8
  tar -czf "$OUT/table6_runs.tar.gz" --exclude=checkpoints --exclude=run.lock -C "$log" .
  stamp "T. done: $OUT/table6_summary.txt, table6_tables.md, table6_runs.tar.gz (lane logs and sweeps/detr_gpu)"
  return $status
}

if [ "${1:-}" = table6 ]; then
  shift
  table6_step "$@"
  exit $?
fi

stamp "0. fused Triton kernel: CUDA tests, then DeiT-S / Swin-T with @triton"
timeout 100 python3 -m pytest --noconftest -o addopts="" -p no:cacheprovider -q -s tests/test_rpe_triton.py -k cuda \
  > "$OUT/rpe_triton_cuda.txt" 2>&1
grep -E "SPEED|ERROR|passed|failed|Error" "$OUT/rpe_triton_cuda.txt" | tail -40
timeout 90 python3 scripts/benchmark.py --model deit_small --bf16 --batch 128 --steps 20 --warmup 3 \
  --presets none irpe_k irpe_k@triton irpe_bias_k irpe_bias_k@triton irpe_qk@triton irpe_qkv irpe_qkv@triton \
  --json "$OUT/bench_deit_small_triton.json" > "$OUT/bench_deit_small_triton.txt" 2>&1
tail -12 "$OUT/bench_deit_small_triton.txt"
timeout 60 python3 scripts/benchmark.py --model swin_tiny --bf16 --batch 128 --steps 15 --warmup 3 \
  --presets swin swin@triton irpe_k irpe_k@triton irpe_qkv irpe_qkv@triton \
  --json "$OUT/bench_swin_tiny_triton.json" > "$OUT/bench_swin_tiny_triton.txt" 2>&1
tail -8 "$OUT/bench_swin_tiny_triton.txt"

stamp "1. DeiT-S bf16 benchmark"
timeout 70 python3 scripts/benchmark.py --model deit_small --bf16 --batch 128 --steps 20 --warmup 3 \
  --presets none irpe_k irpe_k@eager irpe_k@flex irpe_qk irpe_qk@eager irpe_qk@flex irpe_qkv irpe_bias_k irpe_bias_k@flex \
  irpe_k@naive irpe_qkv@naive --json "$OUT/bench_deit_small_bf16.json" > "$OUT/bench_deit_small.txt" 2>&1
tail -16 "$OUT/bench_deit_small.txt"

stamp "1b. one attention layer, piece by piece (incl. FlexAttention formulations)"
timeout 40 python3 scripts/profile_attention.py 2>&1 | grep -v -i warn > "$OUT/profile_attention.txt"
grep -E "ms|FAILED" "$OUT/profile_attention.txt" | tail -20

stamp "2. rpe CUDA parity and attention timings"
timeout 60 python3 -m pytest --noconftest -o addopts="" -p no:cacheprovider -q -s tests/test_rpe_cuda.py \
  > "$OUT/rpe_cuda.txt" 2>&1
grep -E "SPEED|passed|failed|Error" "$OUT/rpe_cuda.txt" | tail -20

train() {  # name, timeout, then train.py overrides
  local name=$1 limit=$2; shift 2
  stamp "3. train $name"
  timeout "$limit" python3 train.py trainer=gpu data.num_workers=6 print_config=false callbacks.progress_bar=null \
    paths.data_dir=/tmp/data paths.log_dir=/tmp/runs run_name="$name" "$@" > "$OUT/train_$name.log" 2>&1
  echo "rc=$?" >> "$OUT/train_$name.log"
  tail -4 "$OUT/train_$name.log"
}
train flex 60 rpe.backend=flex
train auto 40

stamp "4. Swin-T bf16 benchmark"
timeout 30 python3 scripts/benchmark.py --model swin_tiny --bf16 --batch 128 --steps 15 \
  --presets swin irpe_k irpe_qkv --json "$OUT/bench_swin_tiny_bf16.json" > "$OUT/bench_swin_tiny.txt" 2>&1
tail -6 "$OUT/bench_swin_tiny.txt"

python3 - "$OUT/train_summary.json" <<'PY'
import glob, json, os, sys
rows = {}
for run in sorted(glob.glob("/tmp/runs/*")):
    path = f"{run}/metrics.json"
    rows[os.path.basename(run)] = json.load(open(path)) if os.path.exists(path) else "no metrics.json"
json.dump(rows, open(sys.argv[1], "w"), indent=1)
print(json.dumps(rows, indent=1)[:1500])
PY
stamp "done"
