# Call 5: the kernel's consume() with a loop per run of one KV tile (the visit loop's back-edge then jumps straight to
# the next visit, not over the dK / dV epilogue), against the tree's (.ab_base/kernels_src, HEAD's kernels), each
# twice in alternation: the kernel's own warpgroups on the synthetic problem (level 13) and on full 3840 / 15360
# (level 15, deterministic), with the bits of dq_accum, dk and dv after each level-15 run.
export CUPY_DASH_COMMIT=${CUPY_DASH_COMMIT:-unset} CUPY_DASH_CACHE_DIR=/tmp/dash_cache
TOP=${OUT:-/root/out}; OUT=$TOP/call5; mkdir -p $OUT
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $OUT/device_info5.txt
cd benchmarks
for round in 1 2; do
  timeout 100 python3 with_kernels.py ../.ab_base/kernels_src gemm_chain.py --levels 13 15 --real full:3840 full:15360 \
    --json $OUT/base_$round.json 2>&1 | tee $OUT/base_$round.txt
  timeout 100 python3 gemm_chain.py --levels 13 15 --real full:3840 full:15360 --json $OUT/nested_$round.json 2>&1 \
    | tee $OUT/nested_$round.txt
done
cd $TOP && tar czf call5.tgz call5 && rm -r call5
