# Round 34, call 2 (~7 min warm; carry .whl): call 1 said the two warpgroups' exp2 stretches do not contend (README).
# Nsight Compute at full 3840 (B 4), ours deterministic and FA3's non-deterministic kernel beside four patched copies
# of ours (patches/): cut_exp2_wg0 (timing only: MMA warpgroup 0 takes no exp2), exp2_early_wg0 / exp2_early_wg1 /
# exp2_early_both (that warpgroup's 40 exp2 held ahead of its dP^T wait). Archive: $OUT/ncu_cuts.tgz.
R=benchmarks/results/experiments
SHORT=1 PATCHES=$R/round34_20261207/patches IMPLS="ours_auto fa3" \
  LEGS="cut_exp2_wg0 exp2_early_both exp2_early_wg0 exp2_early_wg1" bash $R/round31_20261206/call2.sh
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $OUT/device_info.txt
# Then steady_ab of the two one-warpgroup legs (two processes per leg, ours deterministic beside FA3's
# non-deterministic backward): $OUT/steady_ab.{log,tgz}. NCU_ONLY=1 stops before it (a short budget).
[ -n "${NCU_ONLY:-}" ] && exit 0
# BITS=1: first the bits of exp2_early_both against the tree's (the order changes no arithmetic: equal), $OUT/bits/.
if [ -n "${BITS:-}" ]; then
  mkdir -p $OUT/bits
  timeout 150 python3 benchmarks/bits_digest.py --out $OUT/bits/tree.json > $OUT/bits/log.txt 2>&1
  timeout 120 python3 benchmarks/with_kernels.py /tmp/legs/exp2_early_both/kernels_src benchmarks/bits_digest.py \
    --out $OUT/bits/exp2_early_both.json >> $OUT/bits/log.txt 2>&1
  python3 benchmarks/bits_digest.py --compare $OUT/bits/tree.json $OUT/bits/exp2_early_both.json 2>&1 | tail -3
fi
OUT=$OUT FA3_WHL=1 NO_INSTALL=1 LEGS=2 AB_PATCH_DIR=$R/round34_20261207/patches \
  AB_PATCHES="exp2_early_wg0 exp2_early_wg1" \
  STEADY_ARGS="--shapes full:3840 full:15360 causal:8192 --rounds 4 --loop-s 0.4" \
  timeout 300 bash benchmarks/device_run.sh steady_ab 2>&1 | tail -14
