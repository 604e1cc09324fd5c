# Round 38, call 2 (carry .whl; ~4 min with the start, longer if ROUNDS > 0): tests/gpu/test_gpu_pieces.py again
# (call 1's cases 2 and 4 split no column: their CTA counts are mended; trim_tail's causal cuts are new), the
# sanitizers over the split tables (kernels_sanitize.py --pieces-only, the trim case included), then ROUNDS
# alternating rounds (default 0) of the tree's tables against the real split (with_split_tail.py real3) at full
# 1280 / 3840 / 15360 beside FA3, while under 300 s. $OUT: tests.log, sanitize_*.log, ab2.tgz, log.txt.
. benchmarks/device_env.sh
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_pieces.py > $O/tests.log 2>&1
tail -3 $O/tests.log | sed "s/^/tests /" | tee -a $O/log.txt
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  timeout 100 "$san" --tool $tool --report-api-errors no --error-exitcode 9 python3 benchmarks/kernels_sanitize.py \
    --pieces-only > $O/sanitize_$tool.log 2>&1
  echo "sanitize $tool rc $? $(grep -c 'Race reported' $O/sanitize_$tool.log) race reports" | tee -a $O/log.txt
done
T=/tmp/ab2; mkdir -p $T
args="--shapes full:1280 full:3840 full:15360 --impls dash_det fa3_nondet --rounds 4"
for n in $(seq 1 ${ROUNDS:-0}); do
  [ $SECONDS -gt 300 ] && break
  timeout 100 python3 benchmarks/burst_bench.py $args --json $T/tree_$n.json 2>&1 | tail -3 | sed "s/^/tree$n /" \
    | tee -a $O/log.txt
  timeout 100 python3 benchmarks/with_split_tail.py real3 benchmarks/burst_bench.py $args --json $T/real_$n.json \
    2>&1 | grep -v "^with_split_tail" | tail -3 | sed "s/^/real$n /" | tee -a $O/log.txt
  (cd $T && tar czf $O/ab2.tgz *.json)
done
echo "call2: $SECONDS s" | tee -a $O/log.txt
