# Round 39, call 1 (carry .whl; ~9 min with the start): the split KV columns' A/B in time for `auto`. Head dim 128:
# the tree's tables against with_split_tail.py real3 at full 1280 / 3840 / 15360 beside FA3's non-deterministic
# backward, three alternating rounds (round 38's call 3 without its causal legs: the trim is closed). Head dim 64
# (128 x 128 tiles, 12 split columns): the tree, real3 and real6 at full 3840 / 15360, ours alone, two rounds.
# $OUT: ab.tgz (<leg>_<hdim>_<n>.json), log.txt.
. benchmarks/device_env.sh
T=/tmp/ab; mkdir -p $T
d128="--shapes full:1280 full:3840 full:15360 --impls dash_det fa3_nondet --rounds 4"
d64="--hdim 64 --shapes full:3840 full:15360 --impls dash_det --rounds 4"
leg() {  # leg <name> <mode or -> <hdim> <n> <args...>
  local name=$1 mode=$2 hd=$3 n=$4; shift 4
  if [ "$mode" = - ]; then
    timeout 100 python3 benchmarks/burst_bench.py "$@" --json $T/${name}_${hd}_$n.json 2>&1 | tail -3
  else
    timeout 100 python3 benchmarks/with_split_tail.py $mode benchmarks/burst_bench.py "$@" \
      --json $T/${name}_${hd}_$n.json 2>&1 | grep -v "^with_split_tail" | tail -3
  fi | sed "s/^/$name d$hd $n /" | tee -a $O/log.txt
  (cd $T && tar czf $O/ab.tgz *.json)
}
for n in 1 2 3; do
  [ $SECONDS -gt 470 ] && break
  leg tree - 128 $n $d128
  leg real3 real3 128 $n $d128
  [ $n = 3 ] && break
  leg tree - 64 $n $d64
  leg real3 real3 64 $n $d64
  leg real6 real6 64 $n $d64
done
echo "call1: $SECONDS s" | tee -a $O/log.txt
