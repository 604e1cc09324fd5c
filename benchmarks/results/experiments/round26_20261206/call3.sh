# Call 3: the kernel's own three roles on the bench's real problems (levels 14 / 15: the package's parameter block,
# tables and tensors, clock64 around the MMA warpgroups) beside the synthetic level 13; what the KV-tile switch costs
# per visit with runs of 48, 192 and 512 visits; the real problem stamped, beside the kernel's own timeline build.
# Everything lands in $OUT/call3 and comes back as call3.tgz.
export CUPY_DASH_COMMIT=${CUPY_DASH_COMMIT:-unset} CUPY_DASH_CACHE_DIR=/tmp/dash_cache
TOP=${OUT:-/root/out}; OUT=$TOP/call3; mkdir -p $OUT
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $OUT/device_info3.txt
cd benchmarks
timeout 120 python3 gemm_chain.py --levels 9 13 --run 192 --json $OUT/gemm_chain_run192.json 2>&1 \
  | tee $OUT/gemm_chain_run192.txt
timeout 120 python3 gemm_chain.py --levels 9 13 --run 512 --json $OUT/gemm_chain_run512.json 2>&1 \
  | tee $OUT/gemm_chain_run512.txt
timeout 200 python3 gemm_chain.py --levels 13 14 15 --real full:3840 full:15360 --json $OUT/gemm_chain_real.json 2>&1 \
  | tee $OUT/gemm_chain_real.txt
timeout 150 python3 gemm_chain.py --levels 13 14 15 --real full:3840 --stamps --repeats 1 \
  --json $OUT/gemm_chain_real_stamps.json 2>&1 | tee $OUT/gemm_chain_real_stamps.txt
CUPY_DASH_BWD_FULL_BLOCK_M=80 timeout 200 python3 timeline.py --shapes 128:full:3840 --policies symmetric_shift \
  --out /tmp/tl.npz 2>&1 | tee $OUT/timeline_full3840_m80.txt
cd $TOP && tar czf call3.tgz call3 && rm -r call3
