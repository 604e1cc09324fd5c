# Round 39, call 2 (carry .whl; ~10 min with the start): `auto` with split KV columns (tree of this commit) on the
# GPU. First tests/gpu/test_gpu_pieces.py (its new test_auto_splits_long_full_masks: the full path at 30 Q tiles,
# head dims 128 and 64), then the standing beside FA3 (benchmarks/standing.sh: head dim 128 with ours deterministic
# and atomic and FA3's two backwards, head dim 64), then the split shape under a torch CUDA graph and jax.jit(grad),
# then the forward's standing, each while time is left. $OUT: tests.log, frameworks.log, call2.tgz, log.txt.
. benchmarks/device_env.sh
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_pieces.py > $O/tests.log 2>&1
tail -3 $O/tests.log | sed "s/^/tests /" | tee -a $O/log.txt
TOP=/tmp/call2 PARTS="d128 d64" bash benchmarks/standing.sh 2>&1 | tee -a $O/log.txt
(cd /tmp/call2 && tar czf $O/call2.tgz *)
if [ $SECONDS -lt 470 ]; then
  timeout $((560 - SECONDS)) python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_torch_ops.py \
    tests/gpu/test_gpu_jax_jit.py -k "sq2400" > $O/frameworks.log 2>&1
  tail -3 $O/frameworks.log | sed "s/^/frameworks /" | tee -a $O/log.txt
fi
if [ $SECONDS -lt 440 ]; then
  TOP=/tmp/call2 PARTS="fwd" bash benchmarks/standing.sh 2>&1 | tee -a $O/log.txt
  (cd /tmp/call2 && tar czf $O/call2.tgz *)
fi
echo "call2: $SECONDS s" | tee -a $O/log.txt
