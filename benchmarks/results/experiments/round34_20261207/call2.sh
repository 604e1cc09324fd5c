# Round 34, call 2 (~2.5 min warm; carry .whl): call 1 said the two warpgroups' exp2 stretches do not contend (README).
# Nsight Compute at full 3840 (B 4), ours deterministic and FA3's non-deterministic kernel beside four patched copies
# of ours (patches/): cut_exp2_wg0 (timing only: MMA warpgroup 0 takes no exp2), exp2_early_wg0 / exp2_early_wg1 /
# exp2_early_both (that warpgroup's 40 exp2 held ahead of its dP^T wait). Archive: $OUT/ncu_cuts.tgz.
R=benchmarks/results/experiments
SHORT=1 PATCHES=$R/round34_20261207/patches IMPLS="ours_auto fa3" \
  LEGS="cut_exp2_wg0 exp2_early_both exp2_early_wg0 exp2_early_wg1" bash $R/round31_20261206/call2.sh
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $OUT/device_info.txt
