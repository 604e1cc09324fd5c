# Round 41, call B (prepared, not run; carry .whl; ~5 min with the start): what the rank chain's turns cost at head
# dim 64 (128-query tiles, one Q tile per KV tile at Sq = Sk: nothing to spread, and in the engine model a hop of
# 1.1 visits costs 4-10 % there). Ours deterministic in bursts, the tree against round 40's no_turn_wait kernels
# (timing only: round 40 found them at the atomic path's cycles), one process each, alternating rounds, head dim
# 64 at the bench's four long shapes. $OUT: ab_d64.tgz, log.txt.
. benchmarks/device_env.sh
LEGS="no_turn_wait" HDIMS="64" . benchmarks/results/experiments/round40_20261207/legs.sh
T=/tmp/ab_d64; mkdir -p $T
for n in 1 2 3; do
  [ $SECONDS -gt 330 ] && break
  for leg in tree no_turn_wait; do
    run=(python3); [ $leg = tree ] || run=(python3 benchmarks/with_kernels.py /tmp/legs/$leg/kernels_src)
    timeout 70 "${run[@]}" benchmarks/burst_bench.py --hdim 64 --impls dash_det --rounds 3 \
      --json $T/${leg}_$n.json 2>&1 | grep -E "ours det|rror" | sed "s/^/$leg $n /" | tee -a $O/log.txt
  done
  (cd $T && tar czf $O/ab_d64.tgz *.json)
done
echo "call B: $SECONDS s" | tee -a $O/log.txt
