#!/usr/bin/env bash
# One device run on the H200: install, compile, GPU tests, demo, benchmarks; every log under $OUT.
#   bash benchmarks/device_run.sh [smoke|fwd|tests|bench|integration|pending|long|gqa|varlen|varlen2|varlen_bench|final|next|long1m|session4|session4b|session5|session5b|rank_ahead|all] [extra pytest args...]
# "pending": what the 2026-12-01 (second) session could not run (benchmarks/NOTES.md), in priority order.
# FA3 (flash-attn3-jax) is measured when its wheel is importable: carry .whl/ and set FA3_WHL=1.
set -o pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false CUPY_DASH_CACHE_DIR=${CUPY_DASH_CACHE_DIR:-/tmp/dash_cache}
OUT=${OUT:-/tmp/dash_out}; mkdir -p "$OUT"
stage=${1:-all}; shift || true
py=python3
$py -m pip install --no-build-isolation --no-deps -q -e . >/tmp/install.log 2>&1 || { tail -20 /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
git rev-parse --short HEAD 2>/dev/null
if [ -n "${FA3_WHL:-}" ]; then
  $py -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >"$OUT/fa3_install.log" 2>&1 && export PYTHONPATH=/tmp/site
fi
$py -m cupy_dash compile --all -j 16 >/tmp/compile.log 2>&1 || { tail -20 /tmp/compile.log; exit 1; }
tail -1 /tmp/compile.log
if [ "$stage" = smoke ] || [ "$stage" = all ]; then
  timeout 300 $py -m pytest tests/test_gpu_attention.py -q -x --maxfail=3 -k "d64-full-sq128-sk128 or d128-causal-sq300-sk1000" "$@" 2>&1 | tee "$OUT/smoke.log" | tail -25
fi
if [ "$stage" = fwd ]; then
  timeout 200 $py -m pytest tests/test_gpu_forward.py tests/test_gpu_attention.py -q -x --maxfail=3 \
    -k "forward or rows_without" 2>&1 | tee "$OUT/fwd_tests.log" | tail -15
  timeout 300 $py -m cupy_dash bench --fwd-only --no-overhead --no-compile --out "$OUT" "$@" 2>&1 \
    | tee "$OUT/fwd_bench.log" | tail -45
fi
if [ "$stage" = integration ]; then   # host fast path, JAX under jit, overheads, the training examples
  timeout 200 $py -m pytest tests/test_gpu_fastpath.py tests/test_gpu_jax_jit.py -q -ra "$@" 2>&1 \
    | tee "$OUT/integration_tests.log" | tail -15
  timeout 60 $py benchmarks/host_overhead.py 2>&1 | tee "$OUT/host_overhead.txt"
  (cd examples && timeout 200 $py train_tiny_transformer.py --plot "$OUT/train_torch.png" \
    --json "$OUT/train_torch.json" 2>&1 | tee "$OUT/train_torch.txt" | tail -8)
  (cd examples && timeout 200 $py train_tiny_transformer_jax.py --plot "$OUT/train_jax.png" \
    --json "$OUT/train_jax.json" 2>&1 | tee "$OUT/train_jax.txt" | tail -8)
  timeout 90 $py benchmarks/jax_overhead.py --json "$OUT/jax_overhead.json" 2>&1 | tee "$OUT/jax_overhead.txt" \
    | tail -12
fi
if [ "$stage" = pending ]; then   # tests never run on a GPU, then the whole suite
  timeout 150 $py -m pytest tests/test_gpu_varlen.py tests/test_readme_snippets.py tests/test_gpu_compact.py \
    -q -ra "$@" 2>&1 | tee "$OUT/pending_new_tests.log" | tail -12
  timeout 330 $py -m pytest tests/ -q -ra --maxfail=20 "$@" 2>&1 | tee "$OUT/tests.log" | tail -25
fi
if [ "$stage" = long ] || [ "$stage" = pending ]; then   # long context: S = 256k causal through compact records
  CUPY_DASH_COMPACT_TABLES=1 timeout 120 $py -m cupy_dash bench --seqlens 262144 --tokens 262144 --hdims 128 \
    --masks causal --schedules descending auto --repeats 3 --warmup 1 --input-sets 1 --no-torch --no-fa3 \
    --no-overhead --no-compile --out "$OUT" 2>&1 | tee "$OUT/long_bench.log" | tail -20
fi
if [ "$stage" = varlen ] || [ "$stage" = varlen2 ]; then   # varlen backward, CPU tests under JAX 0.11 with a GPU
  timeout 240 $py -m pytest tests/test_gpu_varlen_bwd.py tests/test_gpu_varlen.py tests/test_readme_snippets.py \
    -q -ra --maxfail=10 "$@" 2>&1 | tee "$OUT/new_tests.log" | tail -15
  timeout 60 $py -m pytest tests/test_jax_ffi.py tests/test_jax_jit.py tests/test_window_api.py -q --tb=short \
    2>&1 > "$OUT/cpu_tests_jax011.log"; tail -3 "$OUT/cpu_tests_jax011.log"
fi
if [ "$stage" = varlen ]; then
  timeout 330 $py -m pytest tests/ -q -ra --maxfail=10 "$@" 2>&1 | tee "$OUT/tests.log" | tail -12
fi
if [ "$stage" = varlen2 ]; then   # the suite's files after test_gpu_varlen_bwd.py that the first run did not reach
  timeout 200 $py -m pytest tests/test_gpu_window.py -q -ra --maxfail=10 2>&1 | tee "$OUT/window_tests.log" | tail -5
fi
if [ "$stage" = varlen_bench ]; then   # varlen throughput and host time; long context: per-visit vs compact
  timeout 200 $py benchmarks/varlen_bwd.py --json "$OUT/varlen_bwd.json" 2>&1 | tee "$OUT/varlen_bwd.txt"
  for compact in 0 1; do
    CUPY_DASH_COMPACT_TABLES=$compact timeout 150 $py -m cupy_dash bench --seqlens 65536 --tokens 65536 \
      --hdims 128 --masks causal --schedules fa3 descending symmetric_shift atomic --repeats 5 --warmup 1 \
      --input-sets 1 --no-torch --no-fa3 --no-overhead --no-compile --out "/tmp/long64k_compact$compact.md" 2>&1 \
      | grep -E "cupy_dash (fwd|bwd)" | head -8
  done
fi
if [ "$stage" = final ]; then   # compact rank table, varlen table cache, JAX 0.11's FFI header, long context
  grep -n -B2 -A8 "typedef struct XLA_FFI_Extension" \
    "$($py -c 'import jax; print(jax.ffi.include_dir())')/xla/ffi/api/c_api.h" > "$OUT/jax011_c_api.txt" 2>&1
  timeout 150 $py -m pytest tests/test_gpu_compact.py tests/test_gpu_varlen_bwd.py -q -ra -x \
    -k "compact or repeat or many" 2>&1 | tee "$OUT/final_tests.log" | tail -4
  for s in 65536 262144; do
    CUPY_DASH_COMPACT_TABLES=1 timeout 150 $py -m cupy_dash bench --seqlens $s --tokens $s --hdims 128 \
      --masks causal --schedules fa3 descending symmetric_shift auto --repeats 3 --warmup 1 --input-sets 1 \
      --no-torch --no-fa3 --no-overhead --no-compile --out "/tmp/long$s.md" 2>&1 | grep -E "cupy_dash (fwd|bwd)" \
      | head -6 | tee -a "$OUT/long_compact.txt"
  done
  timeout 150 $py benchmarks/varlen_bwd.py --repeats 10 --json "$OUT/varlen_bwd.json" 2>&1 | tee "$OUT/varlen_bwd.txt" \
    | tail -34
fi
if [ "$stage" = next ]; then   # what the third session built after its GPU budget was spent (benchmarks/NOTES.md)
  timeout 300 $py -m pytest tests/test_gpu_varlen_bwd.py tests/test_gpu_compact.py tests/test_gpu_torch_ops.py \
    tests/test_gpu_jax_jit.py tests/test_jax_varlen.py tests/test_jax_jit.py -q -ra --maxfail=10 "$@" 2>&1 \
    | tee "$OUT/next_tests.log" | tail -12
  CUPY_DASH_COMPACT_TABLES=1 timeout 150 $py benchmarks/varlen_bwd.py --repeats 10 2>&1 \
    | tee "$OUT/varlen_bwd_compact.txt" | tail -34
  timeout 60 $py benchmarks/varlen_bwd.py --profile > "$OUT/varlen_profile.txt" 2>&1
fi
if [ "$stage" = long1m ]; then   # issue 7: the backward at 1M tokens (compact tables by default there)
  timeout 300 $py -m cupy_dash bench --seqlens 1048576 --tokens 1048576 --hdims 128 --masks causal \
    --schedules descending --repeats 2 --warmup 1 --input-sets 1 --no-torch --no-fa3 --no-overhead --no-compile \
    --out /tmp/long1m.md 2>&1 | grep -E "cupy_dash (fwd|bwd)" | tee "$OUT/long1m.txt"
fi
if [ "$stage" = gqa ]; then   # forward re-check after the varlen change, GQA throughput
  timeout 150 $py -m cupy_dash bench --fwd-only --no-overhead --no-compile --seqlens 1024 4096 16384 \
    --out "$OUT" 2>&1 | tee "$OUT/fwd_bench.log" | tail -30
  for g in 4 8; do
    timeout 150 $py -m cupy_dash bench --group $g --no-overhead --no-compile --seqlens 1024 4096 16384 \
      --schedules auto descending atomic --out "$OUT" 2>&1 | tee "$OUT/gqa${g}_bench.log" | tail -20
  done
fi
if [ "$stage" = session4 ]; then   # fourth session: the error record without copy / event, Library-defined torch ops
  timeout 450 $py -m pytest tests/ -q -ra --maxfail=20 "$@" 2>&1 | tee "$OUT/tests.log" | tail -25
  timeout 90 $py benchmarks/host_overhead.py --profile --json "$OUT/host_overhead.json" > "$OUT/host_overhead.txt" 2>&1
  head -8 "$OUT/host_overhead.txt"
fi
if [ "$stage" = session4b ]; then   # fourth session, second run: fixes, new-packing steps, host time, GQA
  timeout 150 $py -m pytest tests/test_gpu_fastpath.py tests/test_gpu_varlen_bwd.py -q -ra \
    -k "publishes or new_packing or fast_path or repeat" "$@" 2>&1 | tee "$OUT/tests_b.log" | tail -5
  timeout 150 $py benchmarks/varlen_step.py --json "$OUT/varlen_step.json" 2>&1 | tee "$OUT/varlen_step.txt"
  timeout 60 $py benchmarks/host_overhead.py 2>&1 | tee "$OUT/host_overhead.txt"
  timeout 150 $py -m cupy_dash bench --group 8 --no-overhead --no-compile --seqlens 4096 16384 \
    --schedules auto descending atomic --out "$OUT" 2>&1 | tee "$OUT/gqa8_bench.log" | tail -24
fi
if [ "$stage" = session5 ]; then   # what the fourth session built after its GPU budget (benchmarks/NOTES.md)
  timeout 240 $py -m pytest tests/test_gpu_varlen_bwd.py tests/test_gpu_fastpath.py tests/test_gpu_torch_ops.py \
    -q -ra --maxfail=10 "$@" 2>&1 | tee "$OUT/new_tests.log" | tail -8
  timeout 60 $py benchmarks/host_overhead.py 2>&1 | tee "$OUT/host_overhead.txt"
  timeout 150 $py benchmarks/varlen_bwd.py --repeats 10 2>&1 | tee "$OUT/varlen_bwd.txt" | tail -34
fi
if [ "$stage" = session5b ]; then   # the per-step table costs (three forms) and the GQA auto check
  timeout 200 $py benchmarks/varlen_step.py --calls 30 2>&1 | tee "$OUT/varlen_step.txt"
  CUPY_DASH_VARLEN_EXPAND=device timeout 150 $py benchmarks/varlen_bwd.py --repeats 10 2>&1 \
    | tee "$OUT/varlen_bwd_gpu_expand.txt" | tail -34
  for g in 4 8; do
    timeout 100 $py -m cupy_dash bench --group $g --no-overhead --no-compile --seqlens 4096 16384 --hdims 128 \
      --schedules auto descending --repeats 10 --warmup 2 --input-sets 1 --out /tmp/g$g 2>&1 \
      | grep -E "head dim|bwd" | head -12 | tee -a "$OUT/gqa_auto.txt"
  done
fi
if [ "$stage" = rank_ahead ]; then   # benchmarks/patches/writer_rank_ahead.patch (branch writer-rank-ahead) applied
  # to a copy of this tree: its bits against the main tree's (same tables), then compact throughput
  rm -rf /tmp/wra && cp -r . /tmp/wra && (cd /tmp/wra && patch -p1 < benchmarks/patches/writer_rank_ahead.patch \
    && $py -c "import cupy_dash.jit as j; print('patched tree kernels:', j.kernel_dir())" \
    && CUPY_DASH_CACHE_DIR=/tmp/wra_cache $py -m cupy_dash compile --all -j 16 2>&1 | tail -1)
  (cd /tmp/wra && CUPY_DASH_CACHE_DIR=/tmp/wra_cache timeout 200 $py -m pytest tests/test_gpu_compact.py \
    tests/test_gpu_varlen_bwd.py -q -ra --maxfail=5 -k "compact or repeat or per_sequence" 2>&1 \
    | tee "$OUT/rank_ahead_tests.log" | tail -4)
  for tree in . /tmp/wra; do
    (cd $tree && CUPY_DASH_CACHE_DIR=$([ $tree = . ] && echo $CUPY_DASH_CACHE_DIR || echo /tmp/wra_cache) \
      CUPY_DASH_COMPACT_TABLES=1 timeout 100 $py -m cupy_dash bench --seqlens 65536 --tokens 65536 --hdims 128 \
      --masks causal --schedules descending symmetric_shift --repeats 3 --warmup 1 --input-sets 1 --no-torch \
      --no-fa3 --no-overhead --no-compile --out /tmp/ra_bench 2>&1 | grep -E "cupy_dash bwd" | head -2 \
      | sed "s|^|$tree |" | tee -a "$OUT/rank_ahead_bench.txt")
  done
fi
if [ "$stage" = tests ] || [ "$stage" = all ]; then
  timeout 540 $py -m pytest tests/ -q -ra --maxfail=20 --durations=15 "$@" 2>&1 | tee "$OUT/tests.log" | tail -40
fi
if [ "$stage" = bench ] || [ "$stage" = all ]; then
  timeout 120 $py -m cupy_dash demo 2>&1 | tee "$OUT/demo.log" | tail -20
  timeout 400 $py -m cupy_dash bench --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log" | tail -60
fi
