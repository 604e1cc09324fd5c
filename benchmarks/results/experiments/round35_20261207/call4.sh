# Round 35, call 4 (~3 min with the start; carry .whl): Nsight Compute at full 3840 (B 4) of the tree and two
# timing-only legs that take the dQ hand-off's shared-memory traffic away with the GEMMs kept (README, "Call 4"):
# cut_dq_sts (no dQ store into the staging slice: 40 KB per visit), cut_dq_bulk (also no bulk add reading the slice:
# 40 KB more). Then benchmarks/pipe_interference.py again on its committed text. $OUT: ncu_cuts.tgz,
# pipe_interference.{json,txt}, device_info.txt.
R=benchmarks/results/experiments
SHORT=1 PATCHES=$R/round35_20261207/patches IMPLS="ours_auto" LEGS="cut_dq_sts cut_dq_bulk" \
  bash $R/round31_20261206/call2.sh
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $OUT/device_info.txt
timeout 150 python3 benchmarks/pipe_interference.py --json $OUT/pipe_interference.json 2>&1 \
  | tee $OUT/pipe_interference.txt
