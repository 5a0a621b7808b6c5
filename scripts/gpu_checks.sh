#!/usr/bin/env bash
# The GPU-only checks in one prepared run (for a leased H200 through the device tool, or any CUDA box):
#   1. rpe on CUDA: sdpa/eager/compiled-flex parity, forward and backward (tests/test_rpe_cuda.py)
#   2. bf16 training-step time and peak memory: DeiT-S (and Swin-T) with each RPE preset vs timm's plain models
#   3. the embedded relational task: which position encoding reaches the make-train target (fp32, 6 epochs)
# Results go to $OUT (default ./gpu_out). Packages missing on the box can be carried as wheels in .whl/.
set -u
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, timm; print('torch', torch.__version__, 'timm', timm.__version__)" >> "$OUT/gpu.txt" 2>&1

timeout 150 python3 -m pytest --noconftest -o addopts="" -p no:cacheprovider -q -s tests/test_rpe_cuda.py \
  > "$OUT/rpe_cuda.txt" 2>&1

{
  timeout 120 python3 scripts/benchmark.py --model deit_small --bf16 --batch 128 --steps 20 \
    --json "$OUT/bench_deit_small_bf16.json"
  timeout 120 python3 scripts/benchmark.py --model deit_small --bf16 --batch 128 --steps 20 \
    --presets irpe_k irpe_bias_k --backend flex
  timeout 90 python3 scripts/benchmark.py --model swin_tiny --bf16 --batch 128 --steps 20 \
    --json "$OUT/bench_swin_tiny_bf16.json"
} > "$OUT/bench.txt" 2>&1

sweep() {  # name, then train.py overrides
  local name=$1; shift
  timeout 100 python3 train.py trainer=gpu trainer.precision=32-true data.num_workers=6 print_config=false \
    callbacks.progress_bar=null paths.log_dir=/tmp/runs run_name="$name" "$@" > "/tmp/$name.log" 2>&1 \
    || tail -5 "/tmp/$name.log" >> "$OUT/sweep_errors.txt"
}
sweep ape_only rpe=none
sweep ape_irpe_k rpe=irpe_k
sweep ape_irpe_qkv rpe=irpe_qkv
sweep ape_irpe_kv rpe=irpe_k rpe.on=kv
sweep ape_bias_k rpe=irpe_bias_k
sweep noape_irpe_qkv rpe=irpe_qkv model.net.ape=none
sweep noape_irpe_kv rpe=irpe_k rpe.on=kv model.net.ape=none
sweep nothing rpe=none model.net.ape=none
python3 - "$OUT/sweep.json" <<'PY'
import csv, glob, json, os, sys
rows = {}
for run in sorted(glob.glob("/tmp/runs/*")):
    name = os.path.basename(run)
    metrics = json.load(open(f"{run}/metrics.json")) if os.path.exists(f"{run}/metrics.json") else {}
    curve = [round(float(r["val/top1"]), 2) for f in glob.glob(f"{run}/csv/*/metrics.csv")
             for r in csv.DictReader(open(f)) if r.get("val/top1")]
    rows[name] = {"val/top1": metrics.get("val/top1"), "curve": curve, "wall_time_s": metrics.get("wall_time_s")}
json.dump(rows, open(sys.argv[1], "w"), indent=1)
print(json.dumps(rows, indent=1))
PY
