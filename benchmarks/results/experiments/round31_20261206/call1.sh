# Round 31, call 1 (~7 min with the start; no wheel to carry): the GPU steps of the two branches waiting for one, on
# branch round31-pending (main + jax-persistent-fwd + softcap-compact; `git checkout round31-pending` before the
# call). 1) their GPU tests and the neighbours they touch; 2) the sanitizers over the capped builds (the only kernels
# the branches change, the compact ones among them); 3) the JAX forward beside the functional API and the grid build,
# head dims 64 and 128; 4) one long capped backward (compact tables). Everything lands in $OUT/call1.tgz plus the
# printed tails.
export CUPY_DASH_COMMIT=${CUPY_DASH_COMMIT:-unset} CUPY_DASH_CACHE_DIR=/tmp/dash_cache PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false
L=/tmp/call1; mkdir -p $L
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader | tee $L/device_info.txt
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
python3 -m cupy_dash compile --all -j 16 2>&1 | tail -1
timeout -s INT -k 20 170 python3 -m pytest tests/gpu/test_gpu_softcap.py tests/gpu/test_gpu_compact.py \
  tests/gpu/test_gpu_jax_jit.py tests/gpu/test_gpu_forward.py tests/gpu/test_gpu_training_graphs.py -q -n 15 \
  -p no:cacheprovider > $L/tests.log 2>&1; grep -E "FAILED|ERROR" $L/tests.log | head -20; tail -1 $L/tests.log
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck synccheck; do   # the changed kernels: the capped builds (compact ones among them)
  timeout 100 "$san" --tool $tool --error-exitcode 3 python3 benchmarks/kernels_sanitize.py --softcap-only \
    > $L/sanitize_capped_$tool.log 2>&1; echo "$tool rc $?"
done
grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|DIFFERENT" $L/sanitize_*.log | sort | uniq -c
for d in 64 128; do
  timeout 90 python3 benchmarks/jax_forward_build.py --hdim $d --grid --shapes causal:1024 causal:4096 causal:16384 \
    --json $L/jax_fwd_d$d.json 2>&1 | tail -3
done
timeout 90 python3 benchmarks/bench.py --seqlens 262144 --tokens 262144 --hdims 128 --masks causal --softcap 50 \
  --schedules auto --repeats 3 --warmup 1 --input-sets 1 --no-fa3 --no-torch --no-overhead --no-compile --out $L \
  2>&1 | tail -6
(cd $L && tar czf ${OUT:-/root/out}/call1.tgz *)
