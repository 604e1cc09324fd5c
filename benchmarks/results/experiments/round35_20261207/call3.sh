# Round 35, call 3 (~2.5 min with the start; carry .whl): Nsight Compute at full 3840 (B 4) of the tree and two
# timing-only legs that keep the instruction count but take the visit's FP32 math off the FP32 pipe (README,
# "Call 3"): int_ds (dS^T's FADD and FMUL as LOP3 and IMAD), int_both (also the softmax's FFMA as IMAD).
# Archive: $OUT/ncu_cuts.tgz; read with benchmarks/read_cuts.py.
R=benchmarks/results/experiments
SHORT=1 PATCHES=$R/round35_20261207/patches IMPLS="ours_auto" LEGS="int_ds int_both" bash $R/round31_20261206/call2.sh
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $OUT/device_info.txt
