# Round 38, call 3 (carry .whl; ~9 min with the start): the A/B in time of the real splits beside FA3, three
# alternating rounds: the tree's tables against with_split_tail.py real3 at full 1280 / 3840 / 15360, and against
# with_split_tail.py realtrim (trim_tail: causal lists cut at the mean load) at causal 2k / 8k / 16k.
# $OUT: ab3.tgz (tree_<mask>_<n>.json, leg_<mask>_<n>.json), log.txt.
. benchmarks/device_env.sh
T=/tmp/ab3; mkdir -p $T
for n in 1 2 3; do
  for leg in "full real3 full:1280 full:3840 full:15360" "causal realtrim causal:2048 causal:8192 causal:16384"; do
    set -- $leg
    mask=$1 mode=$2; shift 2
    [ $SECONDS -gt 460 ] && break 2
    args="--shapes $* --impls dash_det fa3_nondet --rounds 4"
    timeout 100 python3 benchmarks/burst_bench.py $args --json $T/tree_${mask}_$n.json 2>&1 | tail -3 \
      | sed "s/^/tree $mask $n /" | tee -a $O/log.txt
    timeout 100 python3 benchmarks/with_split_tail.py $mode benchmarks/burst_bench.py $args \
      --json $T/leg_${mask}_$n.json 2>&1 | grep -v "^with_split_tail" | tail -3 | sed "s/^/$mode $n /" \
      | tee -a $O/log.txt
    (cd $T && tar czf $O/ab3.tgz *.json)
  done
done
echo "call3: $SECONDS s" | tee -a $O/log.txt
