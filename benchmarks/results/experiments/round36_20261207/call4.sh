# Round 36, call 4 (~4.5 min with the start; no .whl): Nsight Compute at full 3840 (B 4) and causal 8k (B 2) of the
# tree beside two timing legs of the Q / dO loads (patches/; README "Call 4"): loads_after_dv, loads_after_dp.
# Then the bits of each leg against the tree's. $OUT: ncu_cuts.tgz, bits/.
R=benchmarks/results/experiments/round36_20261207
PATCHES=$R/patches LEGS="loads_after_dv loads_after_dp" IMPLS="ours_auto ours_atomic" \
  bash benchmarks/legs_bits.sh
