# Round 34, call 1 (~6 min warm; carry .whl): issue 19, whose exp2 waits (round 33's README, "Next call").
# 1) Nsight Compute at full 3840 (B 4): ours deterministic, FA3's non-deterministic kernel, and five patched copies of
#    ours from round 33's patches/ (cut_exp2, cut_exp2_wg1, cut_exp2_half: timing only; exp2_fma_g1 / _g2: a share
#    of the exponents on the FMA pipe); then causal 8k (B 2) with three of them. Archive: $OUT/ncu_cuts.tgz.
# 2) steady_ab, two processes per leg: exp2_fma_g1 and exp2_fma_g2 against the tree, ours deterministic beside FA3's
#    non-deterministic backward, full 3840 / 15360 and causal 8k. Log and reports: $OUT/steady_ab.{log,tgz}.
R=benchmarks/results/experiments
P=$R/round33_20261207/patches
export SHORT=1 PATCHES=$P
IMPLS="ours_auto fa3" LEGS="cut_exp2 cut_exp2_wg1 cut_exp2_half exp2_fma_g1 exp2_fma_g2" \
  bash $R/round31_20261206/call2.sh
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $OUT/device_info.txt
IMPLS="ours_auto fa3" LEGS="cut_exp2_wg1 exp2_fma_g1 exp2_fma_g2" SHAPE="--causal --seqlen 8192 --batch 2" \
  bash $R/round31_20261206/call2.sh
cp $P/exp2_fma_g1.patch $P/exp2_fma_g2.patch benchmarks/patches/
OUT=$OUT FA3_WHL=1 NO_INSTALL=1 LEGS=2 AB_PATCHES="exp2_fma_g1 exp2_fma_g2" \
  STEADY_ARGS="--shapes full:3840 full:15360 causal:8192 --rounds 4 --loop-s 0.4" \
  timeout 300 bash benchmarks/device_run.sh steady_ab 2>&1 | tail -14
