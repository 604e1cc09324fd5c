# Round 35, call 5 (~2.5 min with the start): Nsight Compute at full 3840 (B 4), ours deterministic and atomic, of
# the tree, dq_red_regs (timing only: each MMA thread adds its dQ registers into the tile with 16-byte reds, no
# staging slice, no bulk add; README, "Call 5") and cut_dq_bulk (call 4's leg). $OUT/ncu_cuts.tgz.
# NOTES: written as a wrapper of round 31's call2.sh after the run; the run (commit 7aa635e's text) spelled the same
# ncu calls out, legs in the order dq_red_regs, cut_dq_bulk.
R=benchmarks/results/experiments
SHORT=1 PATCHES=$R/round35_20261207/patches IMPLS="ours_auto ours_atomic" LEGS="dq_red_regs cut_dq_bulk" \
  LEG_IMPLS="ours_auto ours_atomic" bash $R/round31_20261206/call2.sh
