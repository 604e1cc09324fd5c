# Round 35, call 6 (~4-6 min with the start): Nsight Compute at full 3840 (B 4), ours deterministic and atomic, of
# dq_add_late (patches/: the writer adds visit j's dQ once both MMA warpgroups have issued visit j + 1's dV; README,
# "Call 6") beside the tree, then the bits of dq_add_late against the tree's (the order of the adds is unchanged:
# equal). $OUT: ncu_cuts.tgz, bits/.
# NOTES: written as a wrapper of round 31's call2.sh after the run; the run (commit 7aa635e's text) spelled the same
# ncu calls out, the leg before the tree.
R=benchmarks/results/experiments
SHORT=1 PATCHES=$R/round35_20261207/patches IMPLS="ours_auto" LEGS="dq_add_late" LEG_IMPLS="ours_auto ours_atomic" \
  bash $R/round31_20261206/call2.sh
mkdir -p $OUT/bits
timeout 150 python3 benchmarks/with_kernels.py /tmp/legs/dq_add_late/kernels_src benchmarks/bits_digest.py \
  --out $OUT/bits/dq_add_late.json > $OUT/bits/log.txt 2>&1
timeout 150 python3 benchmarks/bits_digest.py --out $OUT/bits/tree.json >> $OUT/bits/log.txt 2>&1
python3 benchmarks/bits_digest.py --compare $OUT/bits/tree.json $OUT/bits/dq_add_late.json 2>&1 | tail -3
