# Call 6: benchmarks/patches/consume_run_loop.patch as kept (the capped builds on today's loop) and
# consume_run_loop_kv_once.patch (that loop with K and V waited for once per run before its first S^T and released
# once after its last visit, dK / dV zeroed after the epilogue: FA3's structure) against the tree, three rounds in
# alternation, the kernel on the bench's full-mask problems (level 15, deterministic; full 1280 has runs of 16 visits,
# 3840 of 48, 15360 of 192), with the bits of dq_accum, dk and dv after each run.
export CUPY_DASH_COMMIT=${CUPY_DASH_COMMIT:-unset} CUPY_DASH_CACHE_DIR=/tmp/dash_cache
TOP=${OUT:-/root/out}; OUT=$TOP/call6; mkdir -p $OUT
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $OUT/device_info6.txt
for leg in loop kv_once; do
  patch=consume_run_loop; [ $leg = loop ] || patch=consume_run_loop_$leg
  rm -rf .ab_$leg && mkdir -p .ab_$leg && cp -r kernels_src .ab_$leg/ \
    && (cd .ab_$leg && patch -s -p1 < ../benchmarks/patches/$patch.patch)
done
cd benchmarks
for round in 1 2 3; do
  timeout 60 python3 gemm_chain.py --levels 15 --real full:1280 full:3840 full:15360 --json $OUT/tree_$round.json \
    2>&1 | tee $OUT/tree_$round.txt
  for leg in loop kv_once; do
    timeout 60 python3 with_kernels.py ../.ab_$leg/kernels_src gemm_chain.py --levels 15 --real full:1280 full:3840 \
      full:15360 --json $OUT/${leg}_$round.json 2>&1 | tee $OUT/${leg}_$round.txt
  done
  (cd $TOP && tar czf call6.tgz call6)   # after every round: a call cut short still brings back one file
done
# The stamps' own cost since they are predicated stores, not one lane's branch (twenty-seventh round): level 13 and
# the kernel at full 3840 with and without them; then the kv_once kernel's stamped phases.
timeout 60 python3 gemm_chain.py --levels 13 15 --real full:3840 --json $OUT/plain.json 2>&1 | tee $OUT/plain.txt
timeout 60 python3 gemm_chain.py --levels 13 15 --real full:3840 --stamps --json $OUT/stamps.json 2>&1 \
  | tee $OUT/stamps.txt
timeout 60 python3 with_kernels.py ../.ab_kv_once/kernels_src gemm_chain.py --levels 15 --real full:3840 --stamps \
  --json $OUT/kv_once_stamps.json 2>&1 | tee $OUT/kv_once_stamps.txt
cd .. && timeout 120 python3 -m pytest tests/gpu/test_gpu_timeline.py -q 2>&1 | tail -5 | tee $OUT/timeline_tests.txt
(cd $TOP && tar czf call6.tgz call6)
cd $TOP && rm -r call6
