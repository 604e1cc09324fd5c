# Round 35, call 9 (prepared, not run: the session's device time ran out; ~2.5 min with the start): Nsight Compute at
# full 3840 (B 4), ours deterministic and atomic, of the tree and dq_store_spread (patches/: dK issued in two commit
# groups, the dQ store's first half after the dQ wait and its second after dK's first group; same bits; README,
# "Call 9"). Then the bits of dq_store_spread against the tree's. $OUT: ncu_cuts.tgz, bits/.
R=benchmarks/results/experiments
PATCHES=$R/round35_20261207/patches IMPLS="ours_auto ours_atomic" LEGS="dq_store_spread" \
  LEG_IMPLS="ours_auto ours_atomic" bash benchmarks/ncu_legs.sh
mkdir -p $OUT/bits
timeout 150 python3 benchmarks/with_kernels.py /tmp/legs/dq_store_spread/kernels_src benchmarks/bits_digest.py \
  --out $OUT/bits/dq_store_spread.json > $OUT/bits/log.txt 2>&1
timeout 150 python3 benchmarks/bits_digest.py --out $OUT/bits/tree.json >> $OUT/bits/log.txt 2>&1
python3 benchmarks/bits_digest.py --compare $OUT/bits/tree.json $OUT/bits/dq_store_spread.json 2>&1 | tail -3
