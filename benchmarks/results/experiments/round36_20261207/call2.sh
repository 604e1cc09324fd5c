# Round 36, call 2 (~6 min with the start; carry .whl): Nsight Compute at full 3840 (B 4) and causal 8k (B 2) of the
# tree (dQ store in two parts beside dK, merged after call 1), its atomic path and FA3's non-deterministic backward,
# beside three legs of the tree (patches/; README "Call 2"): dq_parts3, dq_parts_steps, dq_parts_handoff. Then the
# bits of each leg against the tree's. $OUT: ncu_cuts.tgz, bits/.
R=benchmarks/results/experiments/round36_20261207
PATCHES=$R/patches LEGS="dq_parts3 dq_parts_steps dq_parts_handoff" IMPLS="ours_auto ours_atomic fa3" \
  bash benchmarks/legs_bits.sh
