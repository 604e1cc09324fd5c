# Round 31, call 2 (~6 min with the start, ~9 with the JAX forward at its end; carry .whl for FA3): issue 19's
# "where the tensor pipe idles" by removal;
# the archive ($OUT/ncu_cuts.tgz) is saved after each leg, so a call cut short keeps what it measured.
# Nsight Compute (cycles, tensor-pipe activity, instructions, warp states) of the main backward at full 3840 (B 4)
# and causal 8k (B 2), head dim 128 bf16: ours deterministic and atomic and FA3's non-deterministic kernel, then six
# timing-only patched copies of ours (patches/cut_*.patch: dQ / dK wrong; each removes one stretch's work).
# NOTES: its Nsight Compute part is benchmarks/ncu_legs.sh since round 35 (this script was that harness before, and
# rounds 33-35 called it so); what it passes keeps the interface those calls used.
R=${OUT:-/root/out}   # the device's $OUT
export CUPY_DASH_CACHE_DIR=/tmp/dash_cache PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
D=benchmarks/results/experiments/round31_20261206
shapes="--seqlen 3840 --batch 4;--causal --seqlen 8192 --batch 2"
impls="ours_auto ours_atomic fa3" legs="cut_exp2 cut_rows cut_ds_math cut_math cut_ds_store cut_dq_store"
# SHORT=1: full 3840 only, ours and FA3, the four legs that tell most, no JAX step (~4 min with the start)
[ -n "${SHORT:-}" ] && shapes="${shapes%%;*}" impls="ours_auto fa3" legs="cut_math cut_dq_store cut_ds_store cut_exp2"
# IMPLS / LEGS / SHAPE: other implementations, legs, one shape (short follow-up calls on a warm machine); LEG_IMPLS:
# the implementations each leg runs as (default ours_auto); PATCHES: a folder searched first for each leg's patch
# (later rounds' legs)
[ -n "${IMPLS:-}" ] && impls=$IMPLS; [ -n "${LEGS+x}" ] && legs=$LEGS
[ -n "${SHAPE:-}" ] && shapes=$SHAPE
OUT=$R SHAPES="$shapes" IMPLS="$impls" LEGS="$legs" PATCHES=${PATCHES:-$D/patches} FALLBACK_PATCHES=$D/patches \
  bash benchmarks/ncu_legs.sh
save() { (cd /tmp/ncu && tar czf $R/ncu_cuts.tgz *.raw.csv *.log *.json 2>/dev/null); }
[ -n "${SHORT:-}" ] && exit 0
# Then, with what is left of the call: the JAX forward's builds again, steadier than call 1's (longer loops, the api
# leg on CuPy arrays since dfb2e51); its JSON files join the archive.
for d in 64 128; do
  timeout 100 python3 benchmarks/jax_forward_build.py --hdim $d --grid --loop-s 1.2 --rounds 4 \
    --shapes causal:1024 causal:4096 causal:16384 --json /tmp/ncu/jax_fwd_d$d.json 2>&1 | tail -3
  save
done
