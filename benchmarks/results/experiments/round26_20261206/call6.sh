# Call 6: benchmarks/patches/consume_run_loop.patch as kept (the capped builds on today's loop) against the tree, three
# rounds in alternation, the kernel on the bench's full-mask problems (level 15, deterministic; full 1280 has runs of
# 16 visits, 3840 of 48, 15360 of 192), with the bits of dq_accum, dk and dv after each run.
export CUPY_DASH_COMMIT=${CUPY_DASH_COMMIT:-unset} CUPY_DASH_CACHE_DIR=/tmp/dash_cache
TOP=${OUT:-/root/out}; OUT=$TOP/call6; mkdir -p $OUT
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $OUT/device_info6.txt
rm -rf .ab_loop && mkdir -p .ab_loop && cp -r kernels_src .ab_loop/ \
  && (cd .ab_loop && patch -s -p1 < ../benchmarks/patches/consume_run_loop.patch)
cd benchmarks
for round in 1 2 3; do
  timeout 60 python3 gemm_chain.py --levels 15 --real full:1280 full:3840 full:15360 --json $OUT/tree_$round.json \
    2>&1 | tee $OUT/tree_$round.txt
  timeout 60 python3 with_kernels.py ../.ab_loop/kernels_src gemm_chain.py --levels 15 --real full:1280 full:3840 \
    full:15360 --json $OUT/loop_$round.json 2>&1 | tee $OUT/loop_$round.txt
done
cd $TOP && tar czf call6.tgz call6 && rm -r call6
