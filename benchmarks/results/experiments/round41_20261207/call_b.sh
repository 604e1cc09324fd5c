# Round 41, call B (prepared, not run; carry .whl; ~8 min with the start): the rank chain's turns where nothing can
# be spread (head dim 64's 128-query tiles at Sq = Sk, one Q tile per KV tile), and half-waves (half_waves.py) as
# the remedy. The backward's GPU tests with half-waves (as a pytest plugin), then ours deterministic in bursts at
# head dim 64's four long shapes, one process each, alternating rounds: the tree, half-waves and round 40's
# no_turn_wait kernels (timing only: the turns' whole cost). $OUT: tests.log, ab_b.tgz, log.txt.
. benchmarks/device_env.sh
LEGS="no_turn_wait" HDIMS="64" . benchmarks/results/experiments/round40_20261207/legs.sh
R=benchmarks/results/experiments/round41_20261207
PYTHONPATH=$R:$PYTHONPATH timeout -s INT -k 10 120 python3 -m pytest -q -rf -n 8 -p no:cacheprovider \
  -p half_waves tests/gpu/test_gpu_attention.py tests/gpu/test_gpu_pieces.py \
  -k "pieces or (backward and not d96 and not d192 and not d256)" > $O/tests.log 2>&1
tail -2 $O/tests.log | sed "s/^/half_waves tests /" | tee -a $O/log.txt
T=/tmp/ab_b; mkdir -p $T
leg_run() {  # leg_run <leg>: the command prefix of a leg
  case $1 in
    tree) echo python3 ;;
    halves) echo python3 $R/half_waves.py ;;
    *) echo python3 benchmarks/with_kernels.py /tmp/legs/$1/kernels_src ;;
  esac
}
for n in 1 2 3; do
  [ $SECONDS -gt 400 ] && break
  for leg in tree halves no_turn_wait; do
    timeout 70 $(leg_run $leg) benchmarks/burst_bench.py --hdim 64 --impls dash_det --rounds 3 \
      --json $T/d64_${leg}_$n.json 2>&1 | grep -E "ours det|rror" | sed "s/^/d64 $leg $n /" | tee -a $O/log.txt
  done
  (cd $T && tar czf $O/ab_b.tgz *.json)
done
echo "call B: $SECONDS s" | tee -a $O/log.txt
