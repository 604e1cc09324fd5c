# The GPU machine's A/B of timing legs and same-bits changes: Nsight Compute of the main backward beside patched
# copies (benchmarks/ncu_legs.sh), then each leg's gradient bits against the tree's (benchmarks/bits_digest.py).
#
#   PATCHES=<folder of <leg>.patch> LEGS="a b" [IMPLS="ours_auto ours_atomic"] [LEG_IMPLS=ours_auto] \
#     [SHAPES="--seqlen 3840 --batch 4;--causal --seqlen 8192 --batch 2"] bash benchmarks/legs_bits.sh
#
# $OUT: ncu_cuts.tgz (read with benchmarks/read_cuts.py), bits/ (tree.json, <leg>.json, log.txt); one line per leg
# says whether its bits equal the tree's.
: "${PATCHES:?set PATCHES}" "${LEGS:?set LEGS}"
IMPLS=${IMPLS-ours_auto ours_atomic} LEG_IMPLS=${LEG_IMPLS:-ours_auto} \
  SHAPES=${SHAPES:---seqlen 3840 --batch 4;--causal --seqlen 8192 --batch 2} bash benchmarks/ncu_legs.sh
mkdir -p $OUT/bits
timeout 150 python3 benchmarks/bits_digest.py --out $OUT/bits/tree.json > $OUT/bits/log.txt 2>&1
for leg in $LEGS; do
  timeout 150 python3 benchmarks/with_kernels.py /tmp/legs/$leg/kernels_src benchmarks/bits_digest.py \
    --out $OUT/bits/$leg.json >> $OUT/bits/log.txt 2>&1
  echo "$leg: $(python3 benchmarks/bits_digest.py --compare $OUT/bits/tree.json $OUT/bits/$leg.json 2>&1 | tail -1)"
done
