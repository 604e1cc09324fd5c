# Round 35, call 7 (~2.5 min with the start): Nsight Compute at full 3840 (B 4) of the tree and exp2_early_dpsum
# (round 34's exp2_early_both with every dpsum group loaded into registers before the dP^T wait; README, "Call 7").
# $OUT/ncu_cuts.tgz.
R=benchmarks/results/experiments
SHORT=1 PATCHES=$R/round35_20261207/patches IMPLS="ours_auto" LEGS="exp2_early_dpsum" bash $R/round31_20261206/call2.sh
