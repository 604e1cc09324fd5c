# Round 30, call 2 (~7 min with the start; carry .whl): the rest of the standing on whichever card comes (NOTES,
# "Issue 19", item 1: head dim 128 with ours deterministic and atomic and FA3's two backwards, head dim 64, the
# forward; one process each), then the tree's whole timeline report at full 3840 and causal 8k with the 80-query tile
# (call 1 kept only its order lines: the load report says whether the gap from S^T to dP^T issue is the dO wait).
# Everything lands in $OUT/call2.tgz.
export CUPY_DASH_COMMIT=${CUPY_DASH_COMMIT:-unset} CUPY_DASH_CACHE_DIR=/tmp/dash_cache PYTHONUNBUFFERED=1
TOP=/tmp/call2; mkdir -p $TOP
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,memory.total --format=csv > $TOP/device_info.txt
cat $TOP/device_info.txt
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
S6="full:1280 full:3840 full:15360 causal:2048 causal:8192 causal:16384"
PYTHONPATH=/tmp/site timeout 200 python3 benchmarks/steady_bench.py --impls dash_det fa3_nondet fa3_det dash_atomic \
  --rounds 3 --loop-s 0.4 --shapes $S6 --json $TOP/steady_d128.json 2>&1 | tail -8
PYTHONPATH=/tmp/site timeout 100 python3 benchmarks/steady_bench.py --hdim 64 --impls dash_det fa3_nondet \
  --rounds 3 --loop-s 0.3 --shapes $S6 --json $TOP/steady_d64.json 2>&1 | tail -7
PYTHONPATH=/tmp/site timeout 110 python3 benchmarks/steady_bench.py --forward --rounds 3 --loop-s 0.3 --shapes \
  causal:1024 causal:2048 causal:4096 causal:8192 causal:16384 full:1280 full:3840 full:15360 \
  --json $TOP/steady_fwd.json 2>&1 | tail -9
(cd benchmarks && CUPY_DASH_BWD_FULL_BLOCK_M=80 CUPY_DASH_BWD_CAUSAL_BLOCK_M=80 timeout 45 python3 timeline.py \
  --shapes 128:full:3840 128:causal:8192 --policies symmetric_shift > $TOP/timeline_tree.txt 2>&1)
grep -E "^d128|dO|Q " $TOP/timeline_tree.txt | head -20
(cd $TOP && tar czf ${OUT:-/root/out}/call2.tgz *)
