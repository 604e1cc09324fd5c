# Round 36, call 7 (prepared for the next session, not run; ~5 min with the start; no .whl): Nsight Compute at full
# 3840 (B 4) and causal 8k (B 2) of the tree beside three legs (patches/; README "Call 7"): dq_split_23 and
# dq_store_64 (the split's proportions) and bulk_after_dp (the writer's bulk add held until the next visit's dP^T is
# complete). Then the bits of each leg against the tree's. $OUT: ncu_cuts.tgz, bits/.
R=benchmarks/results/experiments/round36_20261207
PATCHES=$R/patches LEGS="dq_split_23 dq_store_64 bulk_after_dp" IMPLS="ours_auto ours_atomic" \
  bash benchmarks/legs_bits.sh
# The clock check (decision record, "The dQ store spread over dK", last paragraph): nvidia-smi's sampled clock
# against the clock in the timeline build's own stamps, steady loops of the 80-query tile.
CUPY_DASH_BWD_FULL_BLOCK_M=80 CUPY_DASH_BWD_CAUSAL_BLOCK_M=80 timeout 150 python3 benchmarks/clock_check.py \
  --shapes 128:full:3840 128:causal:8192 --json $OUT/clock_check.json 2>&1 | tail -6
