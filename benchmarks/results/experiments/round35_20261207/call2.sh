# Round 35, call 2 (~2 min with the start): benchmarks/pipe_interference.py, warpgroup 0's wgmma chain beside five
# kinds of other work in warpgroup 1 (README, "Call 2"). $OUT/pipe_interference.json and .txt.
export CUPY_DASH_CACHE_DIR=/tmp/dash_cache PYTHONUNBUFFERED=1
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > ${OUT:-/tmp}/device_info.txt
timeout 150 python3 benchmarks/pipe_interference.py --json ${OUT:-/tmp}/pipe_interference.json 2>&1 \
  | tee ${OUT:-/tmp}/pipe_interference.txt
