#!/usr/bin/env bash
# Fault probe 5: the setup the cases of /work/probe5/cases.md rely on (base runs, test sets, sweeps, copies, helper
# snippets, the stand-in Python of the shell-script cases). Prepared, not run.
#
# Run it from the repo root of the tree under test (a worktree of main with branch fixL merged, or main itself; the
# shell-script cases H* read their scripts from a `git archive` of $SCRIPT_TREE, default /work/fixL):
#     cd <repo root> && bash /work/probe5/setup.sh 2>&1 | tee /tmp/p5_setup.log
# Then, in every shell that runs cases:  source /tmp/p5/env.sh   (defines P, REPO, R, B, B2, BH, TSE, TSS, TSF,
# TSFS, NOCAP, H, B0, and the functions pychild, waitfor).
# Every command of the recipe is `OMP_NUM_THREADS=1 PYTHONPATH=$PWD timeout 300 /work/main/.venv/bin/python ...`
# ($R below). Nothing here writes outside /tmp/p5 (PYTHONPYCACHEPREFIX keeps __pycache__ out of the tree).
# Setup steps are S1..S24; each prints "== S<n>" and its exit code. A failed step is reported, the rest go on.
set -u
REPO=$PWD
P=/tmp/p5
VPY=/work/main/.venv/bin/python
SCRIPT_TREE=${SCRIPT_TREE:-/work/fixL}
[ -f "$REPO/train.py" ] || { echo "run from the repo root (train.py not found in $REPO)"; exit 2; }
mkdir -p "$P"/{out,x,snip,rv,rs,plots,tabs,hand,tmpd,pycache}

cat > "$P/env.sh" <<EOF
# sourced by every case shell (made by /work/probe5/setup.sh)
export P=$P
export REPO=$REPO
export PYTHONDONTWRITEBYTECODE=1
export PYTHONPYCACHEPREFIX=$P/pycache
# the recipe; 'env' first so that the assignments stay assignments when \$R is expanded
R="env OMP_NUM_THREADS=1 PYTHONPATH=$REPO PYTHONDONTWRITEBYTECODE=1 PYTHONPYCACHEPREFIX=$P/pycache timeout 300 $VPY"
B="debug=fast threads=1 paths.log_dir=$P/runs paths.data_dir=$P/data data.root=$P/data/rel_small data.generator.num_train=64 data.generator.num_val=32"
# B without data.root (rows that name a data root of their own)
B2="debug=fast threads=1 paths.log_dir=$P/runs paths.data_dir=$P/data data.generator.num_train=64 data.generator.num_val=32"
# B without paths.log_dir (rows that give a log dir of their own)
B0="debug=fast threads=1 paths.data_dir=$P/data data.root=$P/data/rel_small data.generator.num_train=64 data.generator.num_val=32"
# hand data (no generator): give data.root=
BH="debug=fast threads=1 paths.log_dir=$P/runs paths.data_dir=$P/data data.generator=null"
# test-set settings: 16-image test sets under \$P/data (eval.py overrides, and evaluate_testsets.py --set words)
TSE="paths.data_dir=$P/data testset.data.generator.num_val=16"
TSS="--set paths.data_dir=$P/data testset.data.generator.num_val=16"
# the committed definitions (2000 images; make_tables counts their results) under \$P/data_full
TSF="paths.data_dir=$P/data_full"
TSFS="--set paths.data_dir=$P/data_full"
# root with the capabilities that override file modes dropped (mode-000 cases), as tests/test_record_bounds.py
NOCAP="setpriv --bounding-set=-dac_override,-dac_read_search --inh-caps=-dac_override,-dac_read_search"
# helper module of the Python snippets: \$R -c "\$H; ..."
H="import sys; sys.path.insert(0, '$P/snip'); from h import *"
EOF
cat >> "$P/env.sh" <<'EOF2'
# $R ... & leaves in $! the pid of the timeout that runs python (env execs it): pychild gives python's pid.
# GNU timeout forwards TERM, INT, HUP (and QUIT, ALRM) to python; send USR1/USR2 (and kill -9) to pychild.
pychild() { pgrep -P "$1" | head -n 1; }
# waitfor FILE PATTERN [SECONDS]: until PATTERN appears in FILE (default 120 s); 1 on timeout
waitfor() { local i=0; while ! grep -q -- "$2" "$1" 2>/dev/null; do sleep 0.1; i=$((i+1)); [ "$i" -ge $(( ${3:-120} * 10 )) ] && return 1; done; return 0; }
# the signal cases send SIGINT to background jobs: with job control on, they do not start with SIGINT ignored
set -m
EOF2
# shellcheck source=/dev/null
. "$P/env.sh"

step() {  # step <id> <command...>: run, log, report the exit code
  local id=$1; shift
  echo "== $id: $*"
  ( eval "$@" ) > "$P/out/setup_$id.txt" 2>&1
  local rc=$?
  echo "   rc $rc ($(tail -n 1 "$P/out/setup_$id.txt" | cut -c1-160))"
}

# ---------------------------------------------------------------------------------------------- base runs
step S1 '$R train.py $B run_name=base1'                                    # 12.50, the default DeiT run
step S2 '$R train.py $B run_name=d1 seed=1 && $R train.py $B run_name=d2 seed=2'
step S3 '$R train.py $B run_name=sc1 model.net.ape=sincos'                 # a sin-cos APE (ape=extend)
step S4 '$R train.py $B run_name=rope1 rpe=rope_axial model.net.ape=none'
step S5 '$R train.py $B run_name=swin1 model=swin_micro'
step S6 '$R train.py $B run_name=v2a model=swinv2_micro && $R train.py $B run_name=v2cpb model=swinv2_micro rpe=cpb'
step S7 '$R train.py $B run_name=dec1 rpe=decomposed'
step S8 '$R train.py $B run_name=ddp1 trainer=ddp_cpu trainer.devices=2 data.batch_size=16'

# ---------------------------------------------------------------------------------------------- test sets
# 16-image sets for the eval.py / evaluate_testsets.py cases
step S9 '$R scripts/generate_testsets.py relational_right relational_left relational_everywhere relational_canvas48 relational_canvas64 --set $TSE'
# the committed definition of relational_right (what make_tables counts), for the stale-result cases F1, F2
step S10 '$R scripts/generate_testsets.py relational_right --set $TSF'
# a 2000-image set for the signal cases (a test that lasts some seconds at batch_size=1)
step S11 '$R scripts/generate_testsets.py relational_everywhere --set paths.data_dir=$P/data_big testset.data.generator.num_val=2000'
step S12 '$R eval.py ckpt_path=$P/runs/base1/checkpoints/best.ckpt testset=relational_right $TSE'
step S13 '$R eval.py ckpt_path=$P/runs/sc1/checkpoints/best.ckpt testset=relational_canvas48 ape=extend $TSE'

# ---------------------------------------------------------------------------------------------- sweeps, archives
# sw1: a sweep with Hydra's numbered job dirs (hydra.sweep.subdir=${hydra.job.num}, the default)
step S14 '$R train.py $B -m seed=0,1 hydra.sweep.dir=$P/sw1'
# swshift: a configs/sweep sweep (job dirs named after their overrides, findings snapshot per job); whole epochs
# (limit_train_batches=null: benchmark_mini's batch 16 gives 4 steps), so its jobs are results, not smoke runs
step S15 '$R train.py $B2 -m sweep=shift_mini row=none,product_ctx seed=0 data.root=$P/data/left_small trainer.limit_train_batches=null hydra.sweep.dir=$P/swshift'
step S16 '$R scripts/archive_runs.py $P/swshift --to $P/arch'
# the committed mini archive (jobs hold config.yaml, .hydra/, metrics.json, no run.json, no checkpoints/)
step S17 'mkdir -p $P/arch_old && cp -a $REPO/docs/ablations_mini_runs/where_mini $P/arch_old/ && ls $P/arch_old/where_mini | head -3'
# a copy of a big committed benchmark archive (348 runs) for the archive/make_tables signal cases
step S18 'mkdir -p $P/bench_copy && cp -a $REPO/docs/benchmark_runs/shift_mini $P/bench_copy/'

# ---------------------------------------------------------------------------------------------- hand data, DETR
# h1: hand data (no generator, no marker) copied from the generated root; h1c: a second copy nobody trains on
step S19 'mkdir -p $P/hand/h1 && cp -a $P/data/rel_small/train $P/data/rel_small/val $P/hand/h1/ && cp -a $P/hand/h1 $P/hand/h1c && $R train.py $BH data.root=$P/hand/h1 run_name=h1'
step S20 '$R train.py debug=fast threads=1 paths.log_dir=$P/runs paths.data_dir=$P/data experiment=detr_shapes data.root=$P/data/sc_small data.generator.num_train=32 data.generator.num_val=16 run_name=detr1 && $R scripts/generate_testsets.py shapes_coco_canvas256 --set paths.data_dir=$P/data testset.data.generator.num_val=8'

# ---------------------------------------------------------------------------------------------- RoPE files, snippets
cat > "$P/snip/h.py" <<EOF
"""Helpers of the probe-5 Python snippets (RoPE-ViT / RoPE-Swin / DETR exporters). Import with: \$R -c "\$H; ..."."""
import math
import sys

sys.path.insert(0, "$REPO")
import torch  # noqa: E402

from models import (  # noqa: E402
    from_rope_swin_checkpoint,
    from_rope_vit_checkpoint,
    to_rope_swin_checkpoint,
    to_rope_vit_checkpoint,
)

P = "$P"
RV = f"{P}/rv/axial_ape.pth"     # RoPE-ViT DeiT: axial + APE, width 32, 2 heads, 2 blocks, patch 8, 16 px, 5 classes
RV_MIXED = f"{P}/rv/mixed.pth"   # RoPE-ViT DeiT: mixed, no APE
RS_MIXED = f"{P}/rs/mixed.pth"   # RoPE-ViT Swin: mixed, 32 px, patch 4, window 4, depths (2, 2), heads (2, 2)
RS_AXIAL = f"{P}/rs/axial.pth"   # RoPE-ViT Swin: axial, theta 50
SW1_GRID = f"{P}/sw1/multirun.yaml"
OLD_JOB = f"{P}/arch_old/where_mini/model.net.ape=none,rpe.preset=none,seed=0"


def describe(out):
    """One line about what a call returned: a model's RPE, theta, image size and whether a forward is finite."""
    if isinstance(out, torch.nn.Module):
        cfg = getattr(out, "rpe_config", None)
        size = tuple(getattr(getattr(out, "patch_embed", None), "img_size", ()) or ())
        try:
            with torch.no_grad():
                y = out(torch.randn(1, 3, *size)) if size else None
            finite = None if y is None else bool(torch.isfinite(y).all())
        except Exception as err:  # noqa: BLE001
            finite = f"forward failed: {type(err).__name__}"
        return f"method={getattr(cfg, 'method', None)} theta={getattr(cfg, 'theta', None)} img={size} finite={finite}"
    return repr(out)[:200]


def attempt(fn, *args, **kwargs):
    """Call and print OK <what> or ERR <type>: <message> (one line, as a user sees it)."""
    try:
        print("OK", describe(fn(*args, **kwargs)))
    except Exception as err:  # noqa: BLE001
        print("ERR", type(err).__name__ + ":", " ".join(str(err).split())[:500])


def vit_state(mixed=False, ape=True):
    from tests.test_rope_vit_checkpoint import hand_state
    return hand_state(mixed, ape)


def swin_state(mixed=True, **kw):
    from tests.test_rope_swin_checkpoint import hand_state
    return hand_state(mixed, **kw)


def save(path, state, **extra):
    torch.save({"model": state, **extra}, path)
    return path


def md5(path):
    import hashlib
    return hashlib.md5(open(path, "rb").read()).hexdigest()


def detr_model():
    """The DETR of run detr1 (its module's .model), built from its config.yaml by plain calls."""
    from lifecycle.run_config import build_data_and_model, load_run_config
    _, module = build_data_and_model(load_run_config(f"{P}/runs/detr1/config.yaml"))
    return module.model
EOF
step S21 '$R -c "$H
save(RV, vit_state(False, True), arch={\"num_heads\": 2, \"img_size\": [16, 16], \"theta\": 100.0})
save(RV_MIXED, vit_state(True, False), arch={\"num_heads\": 2, \"img_size\": [16, 16]})
save(RS_MIXED, swin_state(True)); save(RS_AXIAL, swin_state(False))
attempt(from_rope_vit_checkpoint, RV); attempt(from_rope_swin_checkpoint, RS_MIXED); attempt(from_rope_swin_checkpoint, RS_AXIAL)"'

# ---------------------------------------------------------------------------------------------- shell-script cases
# a copy of the scripts' tree (no .venv) and the stand-in Python of probe 4 (passes the import probe, answers the
# GPU probe from FAKE_GPU, runs train.py / scripts/*.py as a no-op that exits FAKE_RC after FAKE_SLEEP seconds,
# any other code on the venv Python); every call is logged to $P/fakepy.log
step S22 'rm -rf $P/alt && mkdir -p $P/alt && git -C $SCRIPT_TREE archive HEAD | tar -x -C $P/alt && ls $P/alt/scripts/script_checks.sh'
cat > "$P/fakepy" <<'EOF'
#!/usr/bin/env bash
echo "$$ $*" >> /tmp/p5/fakepy.log
if [ "${1:-}" = -c ]; then
  case "$2" in
    "import torch, hydra, timm") exit 0 ;;
    *cuda.is_available*)
      if [ "${FAKE_GPU:-0}" = 1 ]; then
        case "$2" in *"print('trainer=gpu"*) echo "trainer=gpu trainer.precision=32-true" ;; *) echo True ;; esac
      else
        case "$2" in *"print('trainer=gpu"*) echo "" ;; *) echo False ;; esac
      fi
      exit 0 ;;
    *) exec /work/main/.venv/bin/python "$@" ;;
  esac
fi
case "${1:-}" in
  train.py) echo "Launching (stand-in)"; sleep "${FAKE_SLEEP:-0}"; exit "${FAKE_RC:-0}" ;;
  scripts/*) sleep "${FAKE_SLEEP:-0}"; exit "${FAKE_RC:-0}" ;;
esac
exec /work/main/.venv/bin/python "$@"
EOF
chmod +x "$P/fakepy"
step S23 '$P/fakepy -c "import torch, hydra, timm" && echo fakepy ok'

# ---------------------------------------------------------------------------------------------- copies used by several cases
# rel_copy: a throwaway copy of the generated root (cases that may damage a data root use their own copy of it)
step S24 'cp -a $P/data/rel_small $P/data/rel_copy && ls -a $P/data/rel_copy'

echo "setup done; now: source $P/env.sh"
