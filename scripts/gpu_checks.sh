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
# Results go to $OUT (default ./gpu_out). Packages missing on the box can be carried as wheels in .whl/.
set -u
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
started=$(date +%s)
stamp() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/timeline.txt"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, timm, lightning; print('torch', torch.__version__, 'timm', timm.__version__,
'lightning', lightning.__version__)" >> "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

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
