#!/usr/bin/env bash
# One device run on the H200: install, compile, GPU tests, demo, benchmarks; every log under $OUT.
#   bash benchmarks/device_run.sh [smoke|fwd|tests|bench|integration|long|gqa|varlen_bench|long1m|varlen_step|
#                                  fold|fold_bench|varlen_events|sanitize|ncu|engine|engine_bench|
#                                  dq_writers|multi_gpu|first|first2|fa3_bench|fa3_full|final|tile80|d96|tests2|
#                                  loop_ab|idle|loads|quick_ab|patches_bench|engine_rest|suite|legs_ab|
#                                  short_modes|steady|steady_ab|tail_ab|ncu_conflicts|sections_auto|fwd_order|
#                                  head_dims_sweep|all]
#                                  [extra pytest args...]
# The A/B and one-off measurement stages live in benchmarks/device_stages_ab.sh, which this script sources.
# "engine": the backward kernel's GPU tests (every family: MHA, GQA, compact, varlen, fold, window, portable);
# "engine_bench": the backward at the issue's shapes, this tree against the kernels in every carried .ab*/kernels_src
# (another tree's: git archive <commit> kernels_src | tar -x -C .ab; the bits compare uses .ab), FA3 beside this
# tree when FA3_WHL=1, then ncu. pytest runs get SIGINT at their limit, so that the summary still names the failures.
# "varlen_step": a new packing's host cost, build and upload; "fold": the folded backward's tests, then
# the whole suite; "fold_bench": its GPU and host time. Earlier one-off stages are in this file's
# history (causal80: the causal 80-query tile's legs; tiles_and_varlen: the forward's 176-key tile, varlen and full
# 3840 with either backward tile; heads: the head-dim-192 / 256 forward's tests and tiles; fwd_pairs /
# fwd_persistent: the forward's tile-pair and persistent patches in a patched copy); the writer-rank-ahead
# experiment is benchmarks/patches/writer_rank_ahead.patch (measured, not merged: docs/decisions/table-forms.md).
# "multi_gpu": per-device state with two GPUs in one process, and the DDP / FSDP2 / JAX data-parallel examples
# (torchrun, nccl on two GPUs; gloo with two ranks on one GPU; JAX over every GPU), all logs in multi_gpu.tgz.
# FA3 (flash-attn3-jax) is measured when its wheel is importable: carry .whl/ and set FA3_WHL=1.
set -o pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false CUPY_DASH_CACHE_DIR=${CUPY_DASH_CACHE_DIR:-/tmp/dash_cache}
OUT=${OUT:-/tmp/dash_out}; mkdir -p "$OUT"
stage=${1:-all}; shift || true
py=python3
[ -n "${NO_INSTALL:-}" ] ||   # NO_INSTALL=1: a second stage in the same call, the package already installed
  $py -m pip install --no-build-isolation --no-deps -q -e . >/tmp/install.log 2>&1 || { tail -20 /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
git rev-parse --short HEAD 2>/dev/null
if [ -n "${FA3_WHL:-}" ]; then
  $py -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >"$OUT/fa3_install.log" 2>&1 && export PYTHONPATH=/tmp/site
fi
case "$stage" in   # these stages compile only the kernels they run, on first use
  ncu|engine_bench|dq_writers|first|first2|fa3_bench|fa3_full|final|tile80|d96|loop_ab|idle|loads|quick_ab|\
  patches_bench|engine_rest|legs_ab|short_modes|steady|steady_ab|tail_ab|ncu_conflicts|sections_auto|fwd_order|\
  head_dims_sweep) ;;
  *) $py -m cupy_dash compile --all -j 16 >/tmp/compile.log 2>&1 || { tail -20 /tmp/compile.log; exit 1; }
     tail -1 /tmp/compile.log ;;
esac
if [ "$stage" = smoke ] || [ "$stage" = all ]; then
  timeout -s INT -k 30 300 $py -m pytest tests/gpu/test_gpu_attention.py -q -x --maxfail=3 -k "d64-full-sq128-sk128 or d128-causal-sq300-sk1000" "$@" 2>&1 | tee "$OUT/smoke.log" | tail -25
fi
if [ "$stage" = fwd ]; then
  timeout -s INT -k 30 200 $py -m pytest tests/gpu/test_gpu_forward.py tests/gpu/test_gpu_attention.py -q -x --maxfail=3 \
    -k "forward or rows_without" 2>&1 | tee "$OUT/fwd_tests.log" | tail -15
  timeout 300 $py benchmarks/bench.py --fwd-only --no-overhead --no-compile --out "$OUT" "$@" 2>&1 \
    | tee "$OUT/fwd_bench.log" | tail -45
fi
if [ "$stage" = integration ]; then   # host fast path, JAX under jit, overheads, the training examples
  timeout -s INT -k 30 200 $py -m pytest tests/gpu/test_gpu_fastpath.py tests/gpu/test_gpu_jax_jit.py -q -ra "$@" 2>&1 \
    | tee "$OUT/integration_tests.log" | tail -15
  timeout 60 $py benchmarks/host_overhead.py 2>&1 | tee "$OUT/host_overhead.txt"
  (cd examples && timeout 200 $py train_tiny_transformer.py --plot "$OUT/train_torch.png" \
    --json "$OUT/train_torch.json" 2>&1 | tee "$OUT/train_torch.txt" | tail -8)
  (cd examples && timeout 200 $py train_tiny_transformer_jax.py --plot "$OUT/train_jax.png" \
    --json "$OUT/train_jax.json" 2>&1 | tee "$OUT/train_jax.txt" | tail -8)
  timeout 90 $py benchmarks/jax_overhead.py --json "$OUT/jax_overhead.json" 2>&1 | tee "$OUT/jax_overhead.txt" \
    | tail -12
fi
if [ "$stage" = long ]; then   # long context: S = 256k causal through compact records
  CUPY_DASH_COMPACT_TABLES=1 timeout 120 $py benchmarks/bench.py --seqlens 262144 --tokens 262144 --hdims 128 \
    --masks causal --schedules descending auto --repeats 3 --warmup 1 --input-sets 1 --no-torch --no-fa3 \
    --no-overhead --no-compile --out "$OUT" 2>&1 | tee "$OUT/long_bench.log" | tail -20
fi
if [ "$stage" = varlen_bench ]; then   # varlen throughput and host time; long context: per-visit vs compact
  timeout 200 $py benchmarks/varlen_bwd.py --json "$OUT/varlen_bwd.json" 2>&1 | tee "$OUT/varlen_bwd.txt"
  for compact in 0 1; do
    CUPY_DASH_COMPACT_TABLES=$compact timeout 150 $py benchmarks/bench.py --seqlens 65536 --tokens 65536 \
      --hdims 128 --masks causal --schedules fa3 descending symmetric_shift atomic --repeats 5 --warmup 1 \
      --input-sets 1 --no-torch --no-fa3 --no-overhead --no-compile --out "/tmp/long64k_compact$compact.md" 2>&1 \
      | grep -E "cupy_dash (fwd|bwd)" | head -8
  done
fi
if [ "$stage" = long1m ]; then   # the backward at 1M tokens (compact tables by default there)
  timeout 300 $py benchmarks/bench.py --seqlens 1048576 --tokens 1048576 --hdims 128 --masks causal \
    --schedules descending --repeats 2 --warmup 1 --input-sets 1 --no-torch --no-fa3 --no-overhead --no-compile \
    --out /tmp/long1m.md 2>&1 | grep -E "cupy_dash (fwd|bwd)" | tee "$OUT/long1m.txt"
fi
if [ "$stage" = gqa ]; then   # forward re-check after the varlen change, GQA throughput
  timeout 150 $py benchmarks/bench.py --fwd-only --no-overhead --no-compile --seqlens 1024 4096 16384 \
    --out "$OUT" 2>&1 | tee "$OUT/fwd_bench.log" | tail -30
  for g in 4 8; do
    timeout 150 $py benchmarks/bench.py --group $g --no-overhead --no-compile --seqlens 1024 4096 16384 \
      --schedules auto descending atomic --out "$OUT" 2>&1 | tee "$OUT/gqa${g}_bench.log" | tail -20
  done
fi
if [ "$stage" = fold ]; then   # the folded backward (kernels_src/bwd/fold.cuh): its tests first, then the whole suite
  timeout -s INT -k 30 240 $py -m pytest tests/gpu/test_gpu_fold.py -q -ra --maxfail=5 "$@" 2>&1 | tee "$OUT/fold_tests.log" \
    | tail -12
  if grep -qE "[0-9]+ (failed|error)" "$OUT/fold_tests.log"; then exit 1; fi
  timeout -s INT -k 30 420 $py -m pytest tests/ -q -ra --maxfail=10 --ignore=tests/gpu/test_gpu_fold.py "$@" 2>&1 \
    | tee "$OUT/tests.log" | tail -25
fi
if [ "$stage" = fold_bench ]; then   # GPU time folded / unfolded by size, host time of the torch fast path both ways
  timeout 120 $py benchmarks/fold_bench.py --json "$OUT/fold_bench.json" 2>&1 | tee "$OUT/fold_bench.txt"
  timeout 60 $py benchmarks/host_parts.py 2>&1 | tee "$OUT/host_parts.txt"
  for fold in 0 ""; do
    CUPY_DASH_FOLD=$fold timeout 100 $py benchmarks/host_overhead.py --calls 2000 2>&1 | head -12 \
      | tee -a "$OUT/host_overhead.txt"
  done
fi
if [ "$stage" = varlen_events ]; then   # lazy upload events, deferred releases: the varlen GPU tests, then varlen_step
  timeout -s INT -k 30 300 $py -m pytest tests/gpu/test_gpu_varlen_bwd.py tests/gpu/test_gpu_varlen.py \
    tests/adapters/test_jax_varlen.py tests/gpu/test_gpu_fastpath.py -q -ra --maxfail=5 "$@" 2>&1 | tee "$OUT/varlen_tests.log" | tail -6
  if grep -qE "[0-9]+ (failed|error)" "$OUT/varlen_tests.log"; then exit 1; fi
  stage=varlen_step
fi
if [ "$stage" = sanitize ]; then   # compute-sanitizer over every kernel family (after each kernel change)
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for tool in memcheck racecheck synccheck; do
    timeout 200 "$san" --tool $tool --report-api-errors no --error-exitcode 3 $py benchmarks/kernels_sanitize.py 2>&1 \
      | tee "$OUT/sanitize_$tool.log" | tail -6
  done
  CUPY_DASH_BWD_FULL_BLOCK_M=80 timeout 200 "$san" --tool synccheck --error-exitcode 3 $py benchmarks/kernels_sanitize.py \
    2>&1 | tee "$OUT/sanitize_m80.log" | tail -4
  for tool in racecheck synccheck; do   # the capped 80-query builds, full and causal (their dT slots share dS's bytes)
    CUPY_DASH_BWD_FULL_BLOCK_M=80 CUPY_DASH_BWD_CAUSAL_BLOCK_M=80 timeout 200 "$san" --tool $tool --error-exitcode 3 \
      $py benchmarks/kernels_sanitize.py --softcap-only 2>&1 | tee "$OUT/sanitize_m80_capped_$tool.log" | tail -4
  done
  timeout 200 "$san" --tool synccheck --error-exitcode 3 $py benchmarks/fold_sanitize.py 2>&1 \
    | tee "$OUT/sanitize_fold.log" | tail -4
fi
if [ "$stage" = ncu ]; then   # Nsight Compute: our main backward kernel and FA3's on the same shapes (FA3_WHL=1);
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | tail -1)   # NCU_IMPLS (default "ours_auto fa3";
  mkdir -p /tmp/ncu   # also ours_atomic), NCU_SECTIONS (default --set full): pages, benchmarks/sass_ops.py per pair
  # NCU_SHAPES: ';'-separated ncu_bwd.py shapes; NCU_KSRC: another kernels_src for ours (a patched copy, legs
  # named ${impl}${NCU_TAG}), through benchmarks/with_kernels.py; NCU_FORWARD=1: the forwards instead (NCU_IMPLS
  # "ours fa3"; e.g. NCU_SHAPES="--causal --seqlen 1024 --batch 16;--causal --seqlen 16384 --batch 1")
  IFS=';' read -ra shapes <<<"${NCU_SHAPES:---causal --seqlen 8192 --batch 2;--seqlen 3840 --batch 4}"
  for shape in "${shapes[@]}"; do
    tag=$(echo "$shape" | tr -d ' -' | tr -s 'a-z' | cut -c1-24)
    for impl in ${NCU_IMPLS:-ours_auto fa3}; do
      kern=dash_bwd_main; args=(--impl ours --schedule ${impl#ours_}); run=($py)
      [ -n "${NCU_FORWARD:-}" ] && kern=dash_fwd && args=(--impl ours --forward)
      [ -n "${NCU_KSRC:-}" ] && run=($py benchmarks/with_kernels.py "$NCU_KSRC")
      [ $impl = fa3 ] && kern=regex:FlashAttnBwdSm90 && args=(--impl fa3) && run=($py)
      [ $impl = fa3 ] && [ -n "${NCU_FORWARD:-}" ] && kern=regex:Fwd && args=(--impl fa3 --forward)
      [ $impl != fa3 ] && impl=$impl${NCU_KSRC:+${NCU_TAG:-_ksrc}}
      timeout 240 "$ncu" --profile-from-start off --clock-control none ${NCU_SECTIONS:---set full} --import-source no \
        --kernel-name-base demangled -k "$kern" -c 1 -f -o /tmp/ncu/${impl}_$tag \
        "${run[@]}" benchmarks/ncu_bwd.py "${args[@]}" $shape "$@" >"/tmp/ncu/${impl}_$tag.log" 2>&1
      tail -3 "/tmp/ncu/${impl}_$tag.log"
      "$ncu" -i /tmp/ncu/${impl}_$tag.ncu-rep --page details --csv >/tmp/ncu/${impl}_$tag.details.csv 2>&1
      "$ncu" -i /tmp/ncu/${impl}_$tag.ncu-rep --page raw --csv >/tmp/ncu/${impl}_$tag.raw.csv 2>&1
      "$ncu" -i /tmp/ncu/${impl}_$tag.ncu-rep --page source --csv --print-source sass 2>/dev/null \
        | gzip >/tmp/ncu/${impl}_$tag.sass.csv.gz
      $py benchmarks/ncu_summary.py /tmp/ncu/${impl}_$tag.raw.csv | sed "s/^/${impl}_$tag /"
    done
    [ -n "${NCU_FORWARD:-}" ] && continue   # sass_ops counts the backward's visits
    for impl in ${NCU_IMPLS:-ours_auto fa3}; do
      [ $impl = fa3 ] || [ ! -f /tmp/ncu/fa3_$tag.sass.csv.gz ] && continue
      impl=$impl${NCU_KSRC:+${NCU_TAG:-_ksrc}}
      $py benchmarks/sass_ops.py /tmp/ncu/fa3_$tag.sass.csv.gz /tmp/ncu/${impl}_$tag.sass.csv.gz 2>&1 \
        | tee /tmp/ncu/sass_ops_${impl}_$tag.txt | tail -1 | sed "s/^/$impl $tag, FA3 against ours: /"
    done
  done
  ls -la /tmp/ncu
  [ "${NCU_PROFILE_BWD:-1}" = 1 ] && [ -z "${NCU_FORWARD:-}" ] && timeout 120 $py benchmarks/profile_bwd.py --seqlens 1024 4096 16384 --hdims 128 \
    --schedules auto atomic 2>&1 | tee /tmp/ncu/profile_bwd.log | tail -20   # NCU_PROFILE_BWD=0 skips it
  (cd /tmp/ncu && tar czf "$OUT/ncu.tgz" *.csv *.csv.gz *.log *.txt)
fi
if [ "$stage" = engine ]; then   # with .ab/kernels_src: that tree's kernels compile meanwhile, then the bits compare
  mkdir -p /tmp/eb
  for ab in .ab*; do   # every carried older tree's kernels, for the bits compare (.ab) and engine_bench's legs
    [ -d $ab/kernels_src ] && $py benchmarks/with_kernels.py $ab/kernels_src cupy_dash compile --head-dim 64 \
      --head-dim 128 -j 4 >/tmp/eb/compile_${ab#.}.log 2>&1 &
  done
  timeout -s INT -k 30 450 $py -m pytest tests/gpu/test_gpu_attention.py tests/gpu/test_gpu_gqa.py tests/gpu/test_gpu_compact.py \
    tests/gpu/test_gpu_varlen_bwd.py tests/gpu/test_gpu_fold.py tests/gpu/test_gpu_window.py \
    tests/gpu/test_gpu_portable.py -q -ra --maxfail=5 "$@" 2>&1 | tee "$OUT/engine_tests.log" | tail -12
  wait; tail -qn1 /tmp/eb/compile_*.log 2>/dev/null; [ -d .ab/kernels_src ] && stage=engine_bits
  if grep -qE "[0-9]+ (failed|error)" "$OUT/engine_tests.log"; then exit 1; fi
fi
. "$(dirname "${BASH_SOURCE[0]}")/device_stages_ab.sh"   # the A/B and one-off measurement stages
if [ "$stage" = steady ]; then   # the backward beside FA3's at a steady clock, interleaved loops (FA3_WHL=1)
  timeout ${STEADY_LIMIT:-300} $py benchmarks/steady_bench.py ${STEADY_ARGS:-} --json "$OUT/steady.json" \
    --md "$OUT/steady.md" 2>&1 | tail -8
fi
if [ "$stage" = suite ]; then   # the GPU test files one by one, each under its own limit (SIGINT: the summary still
  extra=("$@")                  # names the failures); SUITE_LANES (default 1) lanes of files run side by side
  lane() {
    for fl in "$@"; do
      f=${fl%%:*}; lim=${fl##*:}; t0=$(date +%s)
      timeout -s INT -k 15 $lim $py -m pytest tests/gpu/test_gpu_$f.py -q -rf -n 8 -p no:cacheprovider "${extra[@]}" \
        >/tmp/suite_$f.log 2>&1
      rc=$?; { echo "== $f"; echo "rc=$rc $(( $(date +%s) - t0 ))s"; grep -E "FAILED|ERROR|Timeout" /tmp/suite_$f.log | head -20
        tail -1 /tmp/suite_$f.log; } >/tmp/suite_$f.summary
      cat /tmp/suite_$f.summary | tee -a "$OUT/gpu_tests_per_file.log"
    done
  }
  files=(${SUITE:?"file:limit pairs, e.g. forward:90 gqa:200"}); lanes=${SUITE_LANES:-1}
  # a caller's timeout (TERM) ends the lanes' pytest runs too (each runs under its own timeout, in a group of its own)
  trap 'pkill -INT -f "pytest tests/gpu/test_gpu_"; sleep 5; pkill -KILL -f "pytest tests/gpu/test_gpu_"; exit 124' TERM INT
  for ((l = 0; l < lanes; l++)); do
    mine=(); worst=0   # a file may run 15 s past its limit (SIGINT, then KILL): warn if the lane could outrun the call
    for ((i = l; i < ${#files[@]}; i += lanes)); do
      mine+=("${files[$i]}"); worst=$((worst + ${files[$i]##*:} + 15))
    done
    [ $worst -gt ${SUITE_BUDGET:-570} ] && echo "suite: lane $l may take ${worst} s, over ${SUITE_BUDGET:-570} s"
    lane "${mine[@]}" &
  done
  wait; (cd /tmp && tar czf "$OUT/suite_logs.tgz" suite_*.log)
fi
if [ "$stage" = varlen_step ]; then   # a new packing's host cost per training step (decisions/table-forms.md)
  timeout 60 $py benchmarks/varlen_plan_cpu.py --packings 200 2>&1 | tee "$OUT/varlen_plan_cpu.txt"
  for mode in "" --torch; do
    timeout 100 $py benchmarks/varlen_step.py --calls 40 --batches 4 16 64 $mode 2>&1 | tee -a "$OUT/varlen_step.txt"
  done
  timeout 60 $py benchmarks/varlen_step.py --calls 40 --batches 16 --torch --parts 2>&1 | tee "$OUT/varlen_parts.txt"
fi
if [ "$stage" = multi_gpu ]; then   # several GPUs (two H200s; on one GPU, the gloo and JAX parts run)
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  rm -rf /tmp/mg && mkdir -p /tmp/mg
  nvidia-smi -L | tee /tmp/mg/gpus.txt
  gpus=$(grep -c "^GPU " /tmp/mg/gpus.txt)
  [ "$gpus" -ge 2 ] || echo "multi_gpu: only $gpus GPU(s): the two-GPU tests skip, this is not the two-GPU run" >&2
  timeout -s INT -k 30 440 $py -m pytest tests/unit/test_per_device.py tests/gpu/test_gpu_multi_device.py \
    tests/gpu/test_gpu_distributed.py -q -ra -p no:cacheprovider --basetemp=/tmp/mg/runs "$@" 2>&1 \
    | tee /tmp/mg/tests.log | tail -20
  rc=${PIPESTATUS[0]}                # pytest's (124: cut at the limit), not grep's
  grep -h "identical" /tmp/mg/runs/*/*.log 2>/dev/null | tail -12
  (cd /tmp/mg && tar czf "$OUT/multi_gpu.tgz" gpus.txt tests.log runs)
  if [ "$rc" -ne 0 ]; then exit 1; fi
fi
# The whole suite no longer fits one call (2026-12-02: 84 % in 540 s): "tests" runs the CPU-side tests in
# parallel and the first half of tests/gpu, "tests2" the second half; -rf names every failure.
gpu_a=(tests/gpu/test_gpu_attention.py tests/gpu/test_gpu_compact.py tests/gpu/test_gpu_fastpath.py
       tests/gpu/test_gpu_fold.py tests/gpu/test_gpu_forward.py)
if [ "$stage" = tests ] || [ "$stage" = all ]; then
  timeout -s INT -k 30 150 $py -m pytest tests/unit tests/adapters -q -rf -n 8 -p no:cacheprovider 2>&1 | tee "$OUT/tests_cpu.log" \
    | tail -6
  timeout -s INT -k 30 400 $py -m pytest "${gpu_a[@]}" -q -rf --maxfail=20 --durations=10 "$@" 2>&1 | tee "$OUT/tests.log" \
    | tail -30
fi
if [ "$stage" = tests2 ]; then
  rest=(); for f in tests/gpu/test_gpu_*.py; do [[ " ${gpu_a[*]} " == *" $f "* ]] || rest+=("$f"); done
  rm -rf /tmp/tests2_tmp
  timeout -s INT -k 30 540 $py -m pytest "${rest[@]}" -q -rf --maxfail=20 --durations=10 --basetemp=/tmp/tests2_tmp \
    "$@" 2>&1 | tee "$OUT/tests2.log" | tail -30
  # the examples' own logs (test_gpu_distributed.py keeps each subprocess's output beside its --json)
  (cd /tmp && find tests2_tmp -name "*.log" | tar czf "$OUT/tests2_logs.tgz" -T - 2>/dev/null)
fi
if [ "$stage" = bench ] || [ "$stage" = all ]; then
  timeout 120 $py -m cupy_dash demo 2>&1 | tee "$OUT/demo.log" | tail -20
  timeout 400 $py benchmarks/bench.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log" | tail -60
fi
