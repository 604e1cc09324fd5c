# Round 38, call 2 (carry .whl; ~8 min with the start): tests/gpu/test_gpu_pieces.py again (call 1's cases 2 and 4
# split no column: their CTA counts are mended), then three more alternating rounds of the tree's tables against
# the real split (with_split_tail.py real3) at full 1280 / 3840 / 15360, beside FA3. $OUT: tests.log, ab2.tgz,
# log.txt.
. benchmarks/device_env.sh
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_pieces.py > $O/tests.log 2>&1
tail -3 $O/tests.log | sed "s/^/tests /" | tee -a $O/log.txt
T=/tmp/ab2; mkdir -p $T
args="--shapes full:1280 full:3840 full:15360 --impls dash_det fa3_nondet --rounds 4"
for n in 1 2 3; do
  [ $SECONDS -gt 200 ] && break
  timeout 100 python3 benchmarks/burst_bench.py $args --json $T/tree_$n.json 2>&1 | tail -3 | sed "s/^/tree$n /" \
    | tee -a $O/log.txt
  timeout 100 python3 benchmarks/with_split_tail.py real3 benchmarks/burst_bench.py $args --json $T/real_$n.json \
    2>&1 | grep -v "^with_split_tail" | tail -3 | sed "s/^/real$n /" | tee -a $O/log.txt
  (cd $T && tar czf $O/ab2.tgz *.json)
done
echo "call2: $SECONDS s" | tee -a $O/log.txt
