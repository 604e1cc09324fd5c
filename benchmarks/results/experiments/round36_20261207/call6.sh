# Round 36, call 6 (prepared for the next session, not run; ~9 min with the start; carry .whl): the standing with the
# dQ store split on whichever card comes (head dim 128: ours deterministic and atomic, FA3's two backwards; head dim
# 64; the forward; one process each, as round 30's call 2), then Nsight Compute's full set of the tree and FA3 at
# full 3840 (B 4) for the source view of the two hand-offs (stall samples at the dQ store, the bulk issue and the
# waits around them; read with benchmarks/sass_ops.py and the .sass.csv.gz pages). $OUT: call6.tgz, ncu.tgz.
export CUPY_DASH_CACHE_DIR=/tmp/dash_cache PYTHONUNBUFFERED=1
TOP=/tmp/call6; TOP=$TOP bash benchmarks/standing.sh
(cd $TOP && tar czf ${OUT:-/root/out}/call6.tgz *)
NCU_PROFILE_BWD=0 FA3_WHL=1 NCU_SHAPES="--seqlen 3840 --batch 4" timeout 200 bash benchmarks/device_run.sh ncu 2>&1 \
  | grep -E "elapsed|FA3 against|rror" | tail -6
