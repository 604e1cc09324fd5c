# Call 1: the rebuilt visit loop, levels 7-9 (level 8 in the kernel's producer order, level 9 with the kernel's
# dK / dV epilogue), then the phase builds of the early legs (--exp2-early 2, --dv-early).
export CUPY_DASH_COMMIT=${CUPY_DASH_COMMIT:-unset} OUT=${OUT:-/root/out}
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $OUT/device_info.txt
cd benchmarks
timeout 200 python3 gemm_chain.py --levels 7 8 9 --json $OUT/gemm_chain_l9.json 2>&1 | tee $OUT/gemm_chain_l9.txt
timeout 300 python3 gemm_chain.py --levels 3 7 8 9 --exp2-early 2 --dv-early --phases \
  --json $OUT/gemm_chain_phases.json 2>&1 | tee $OUT/gemm_chain_phases.txt
