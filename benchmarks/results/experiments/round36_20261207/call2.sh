# Round 36, call 2 (~6 min with the start; carry .whl): Nsight Compute at full 3840 (B 4) and causal 8k (B 2) of the
# tree (dQ store in two parts beside dK, merged after call 1), its atomic path and FA3's non-deterministic backward,
# beside three legs of the tree (patches/; README "Call 2"): dq_parts3, dq_parts_steps, dq_parts_handoff. Then the
# bits of each leg against the tree's. $OUT: ncu_cuts.tgz, bits/.
R=benchmarks/results/experiments/round36_20261207
LEGS="dq_parts3 dq_parts_steps dq_parts_handoff"
PATCHES=$R/patches IMPLS="ours_auto ours_atomic fa3" LEGS="$LEGS" LEG_IMPLS="ours_auto" \
  SHAPES="--seqlen 3840 --batch 4;--causal --seqlen 8192 --batch 2" bash benchmarks/ncu_legs.sh
mkdir -p $OUT/bits
timeout 150 python3 benchmarks/bits_digest.py --out $OUT/bits/tree.json > $OUT/bits/log.txt 2>&1
for leg in $LEGS; do
  timeout 150 python3 benchmarks/with_kernels.py /tmp/legs/$leg/kernels_src benchmarks/bits_digest.py \
    --out $OUT/bits/$leg.json >> $OUT/bits/log.txt 2>&1
  echo "$leg: $(python3 benchmarks/bits_digest.py --compare $OUT/bits/tree.json $OUT/bits/$leg.json 2>&1 | tail -1)"
done
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $OUT/device_info.txt
