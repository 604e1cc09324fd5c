# Call 4: what the run logic costs visits that never use it. One run per CTA (--run 512), levels 8 and 9 with each
# part of the logic kept or removed (--run-logic: 1 the first visit's K / V waits, 2 the last one's releases, 4 the
# epilogue inside the loop), beside level 7 (no runs) and level 9 with runs of 48, all in one call.
export CUPY_DASH_COMMIT=${CUPY_DASH_COMMIT:-unset} CUPY_DASH_CACHE_DIR=/tmp/dash_cache
TOP=${OUT:-/root/out}; OUT=$TOP/call4; mkdir -p $OUT
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $OUT/device_info4.txt
cd benchmarks
timeout 60 python3 gemm_chain.py --levels 7 9 --json $OUT/l7_l9.json 2>&1 | tee $OUT/l7_l9.txt
for logic in 7 6 5 4; do
  timeout 60 python3 gemm_chain.py --levels 8 --run 512 --run-logic $logic --json $OUT/l8_logic$logic.json 2>&1 \
    | tee $OUT/l8_logic$logic.txt
done
for logic in 7 3 0; do
  timeout 60 python3 gemm_chain.py --levels 9 --run 512 --run-logic $logic --json $OUT/l9_logic$logic.json 2>&1 \
    | tee $OUT/l9_logic$logic.txt
done
timeout 60 python3 gemm_chain.py --levels 7 --json $OUT/l7_again.json 2>&1 | tee $OUT/l7_again.txt
cd $TOP && tar czf call4.tgz call4 && rm -r call4
