# Round 40, call 1 (carry .whl; ~6 min with the start): tests/gpu/test_gpu_pieces.py with round 39's sixths case
# (six pieces against the float64 reference, det / atomic, folded / not, repeated bits), then the standing beside
# FA3 on whichever card comes (benchmarks/standing.sh: head dims 128 and 64, the forward). $OUT: tests.log,
# call1.tgz, log.txt.
. benchmarks/device_env.sh
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_pieces.py > $O/tests.log 2>&1
tail -3 $O/tests.log | sed "s/^/tests /" | tee -a $O/log.txt
TOP=/tmp/call1 bash benchmarks/standing.sh 2>&1 | tee -a $O/log.txt
(cd /tmp/call1 && tar czf $O/call1.tgz *)
echo "call1: $SECONDS s" | tee -a $O/log.txt
