# Round 39, call 6 (~3 min with the start): sixths on the GPU against the float64 reference before `auto` takes them
# at head dim 64 (tests/gpu/test_gpu_pieces.py's new p6 case: det / atomic, folded / not, repeated bits).
# $OUT: tests6.log, log.txt.
. benchmarks/device_env.sh
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_pieces.py -k "p6" > $O/tests6.log 2>&1
tail -3 $O/tests6.log | sed "s/^/tests6 /" | tee -a $O/log.txt
echo "call6: $SECONDS s" | tee -a $O/log.txt
