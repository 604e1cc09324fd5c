# Round 30, call 2 (~7 min with the start; carry .whl): the rest of the standing on whichever card comes (NOTES,
# "Issue 19", item 1: head dim 128 with ours deterministic and atomic and FA3's two backwards, head dim 64, the
# forward; one process each), then the tree's whole timeline report at full 3840 and causal 8k with the 80-query tile
# (call 1 kept only its order lines: the load report says whether the gap from S^T to dP^T issue is the dO wait).
# Everything lands in $OUT/call2.tgz.
export CUPY_DASH_CACHE_DIR=/tmp/dash_cache PYTHONUNBUFFERED=1
TOP=/tmp/call2; TOP=$TOP bash benchmarks/standing.sh   # the standing's steps (since round 36 in that script)
(cd benchmarks && CUPY_DASH_BWD_FULL_BLOCK_M=80 CUPY_DASH_BWD_CAUSAL_BLOCK_M=80 timeout 45 python3 timeline.py \
  --shapes 128:full:3840 128:causal:8192 --policies symmetric_shift > $TOP/timeline_tree.txt 2>&1)
grep -E "^d128|dO|Q " $TOP/timeline_tree.txt | head -20
(cd $TOP && tar czf ${OUT:-/root/out}/call2.tgz *)
