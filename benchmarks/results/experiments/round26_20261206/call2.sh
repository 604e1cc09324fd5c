# Call 2: level 10 (the kernel's TMA tensor loads), 11 (its deterministic writers), 12 and 13 (its MMA warpgroups,
# atomic and deterministic) beside level 9; the rebuild's levels 7 and 9-13 with the kernel's timeline stamps; the
# kernel's own timeline at full 3840 (symmetric_shift and atomic) in the same call, so that the phase tables compare
# under the same stamps; and level 9 stamped with two and five k-slices of exp2 before the dP^T wait, with dV issued
# there, and with the early exp2 in warpgroup 0 only (stamped and not).
# Everything lands in $OUT/call2 and comes back as call2.tgz (at most 8 files come back from a call).
export CUPY_DASH_COMMIT=${CUPY_DASH_COMMIT:-unset} CUPY_DASH_CACHE_DIR=/tmp/dash_cache
TOP=${OUT:-/root/out}; OUT=$TOP/call2; mkdir -p $OUT
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $OUT/device_info2.txt
cd benchmarks
timeout 120 python3 gemm_chain.py --levels 9 10 11 12 13 --json $OUT/gemm_chain_l10.json 2>&1 \
  | tee $OUT/gemm_chain_l10.txt
timeout 150 python3 gemm_chain.py --levels 7 9 10 11 12 13 --stamps --repeats 2 --json $OUT/gemm_chain_stamps.json 2>&1 \
  | tee $OUT/gemm_chain_stamps.txt
timeout 120 python3 gemm_chain.py --levels 9 --stamps --exp2-early 2 5 --dv-early --repeats 2 \
  --json $OUT/gemm_chain_stamps_early.json 2>&1 | tee $OUT/gemm_chain_stamps_early.txt
timeout 120 python3 gemm_chain.py --levels 9 --stamps --exp2-early 2 5 --early-wgs 1 --repeats 2 \
  --json $OUT/gemm_chain_stamps_wg0.json 2>&1 | tee $OUT/gemm_chain_stamps_wg0.txt
timeout 120 python3 gemm_chain.py --levels 9 --exp2-early 2 5 --early-wgs 1 --json $OUT/gemm_chain_wg0.json 2>&1 \
  | tee $OUT/gemm_chain_wg0.txt
timeout 250 python3 timeline.py --shapes 128:full:3840 --policies symmetric_shift --out /tmp/tl.npz 2>&1 \
  | tee $OUT/timeline_full3840.txt
cd $TOP && tar czf call2.tgz call2 && rm -r call2
