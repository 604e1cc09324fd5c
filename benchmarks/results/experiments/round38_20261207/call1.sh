# Round 38, call 1 (carry .whl; ~9 min with the start): split KV columns (kernels_src/bwd/pieces.cuh) on the GPU
# for the first time. First their GPU tests (tests/gpu/test_gpu_pieces.py: float64 reference, poisoned outputs,
# repeated bits, det / atomic, folded / not, head dims 64 / 96 / 128, the 80-query tile), then compute-sanitizer's
# memcheck and racecheck over one small split table, then the A/B in time against FA3 at full 3840 / 15360:
# the tree's tables, the real split (with_split_tail.py real3) and round 37's timing-only thirds (with_split_tail.py
# 3), one process each. $OUT: tests.log, sanitize.log, real.tgz, proto.tgz, log.txt.
R=benchmarks/results/experiments/round38_20261207
. benchmarks/device_env.sh
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_pieces.py > $O/tests.log 2>&1
tail -3 $O/tests.log | sed "s/^/tests /" | tee -a $O/log.txt
for tool in memcheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 benchmarks/kernels_sanitize.py --pieces-only \
    >> $O/sanitize.log 2>&1
  echo "sanitize $tool rc $?" | tee -a $O/log.txt
done
T=/tmp/ab; mkdir -p $T
args="--shapes full:3840 full:15360 --impls dash_det fa3_nondet --rounds 4"
for n in 1 2; do
  timeout 100 python3 benchmarks/burst_bench.py $args --json $T/tree_$n.json 2>&1 | tail -2 | sed "s/^/tree$n /" \
    | tee -a $O/log.txt
  timeout 100 python3 benchmarks/with_split_tail.py real3 benchmarks/burst_bench.py $args --json $T/real_$n.json \
    2>&1 | tail -4 | sed "s/^/real$n /" | tee -a $O/log.txt
  (cd $T && tar czf $O/real.tgz *.json)
  [ $SECONDS -gt 420 ] && continue
  timeout 100 python3 benchmarks/with_split_tail.py 3 benchmarks/burst_bench.py $args --tolerance 1e9 \
    --json $T/proto_$n.json 2>&1 | tail -4 | sed "s/^/proto$n /" | tee -a $O/log.txt
  (cd $T && tar czf $O/real.tgz *.json)
done
echo "call1: $SECONDS s" | tee -a $O/log.txt
