#!/usr/bin/env bash
# The A/B and one-off measurement stages of benchmarks/device_run.sh, sourced by it (never run alone): the same
# variables ($py, $OUT, $stage, the extra pytest arguments) and the same one-stage-per-call rule; the usage line and
# the common set-up (install, FA3, compile) are device_run.sh's.
if [ "$stage" = loop_ab ]; then   # the per-warpgroup timeline, then FA3's two remaining loop differences
  mkdir -p /tmp/la   # .ab = this tree's kernels, .ab2 = with the dV wait (bwd-engine.md, "What to try next")
  rm -rf .ab .ab2 .ab3 && mkdir -p .ab .ab2 && cp -r kernels_src .ab/ && cp -r kernels_src .ab2/ \
    && (cd .ab2 && patch -s -p1 < ../benchmarks/patches/dv_wait_before_dk.patch) || exit 1
  timeout -s INT -k 10 120 $py -m pytest tests/gpu/test_gpu_timeline.py -q -ra 2>&1 | tee "$OUT/timeline_tests.log" | tail -3
  timeout 150 $py benchmarks/timeline.py --shapes 128:causal:8192 128:full:3840 --policies shift \
    --out "$OUT/timelines.npz" 2>&1 | tee "$OUT/timeline.txt"
  timeout 120 $py benchmarks/grid_ab.py --json "$OUT/grid_ab.json" 2>&1 | tee "$OUT/grid_ab.txt"
  mkdir -p /tmp/eb && timeout 120 $py benchmarks/bits_digest.py --out /tmp/eb/bits_new.json >/tmp/la/bits.log 2>&1
  timeout 120 $py benchmarks/with_kernels.py .ab2/kernels_src benchmarks/bits_digest.py --out "$OUT/bits_dv_wait.json" \
    >>/tmp/la/bits.log 2>&1
  $py benchmarks/bits_digest.py --compare /tmp/eb/bits_new.json "$OUT/bits_dv_wait.json" | sed "s/^/dV wait: /"
  stage=engine_bench
fi
if [ "$stage" = idle ]; then   # where the tensor pipe idles (phases by percentile, idle cycles by phase), grid order
  timeout -s INT -k 10 120 $py -m pytest tests/gpu/test_gpu_timeline.py -q -ra 2>&1 | tee "$OUT/timeline_tests.log" | tail -3
  timeout 200 $py benchmarks/timeline.py --shapes 128:causal:8192 128:full:3840 --policies shift \
    --out /tmp/timelines.npz 2>&1 | tee "$OUT/timeline.txt"
  timeout 120 $py benchmarks/grid_ab.py --json "$OUT/grid_ab.json" 2>&1 | tee "$OUT/grid_ab.txt"
  timeout -s INT -k 10 240 $py -m pytest tests/gpu/test_gpu_training_graphs.py tests/gpu/test_gpu_transformers.py -q -rf \
    -n 9 -p no:cacheprovider 2>&1 | tee "$OUT/graphs_transformers.log" | tail -8
fi
if [ "$stage" = loads ]; then   # the producer's Q / dO issue against the waits; then without the dQ adds (.ab)
  timeout 200 $py benchmarks/timeline.py --shapes 128:full:3840 128:causal:8192 --policies shift \
    --out /tmp/timelines.npz 2>&1 | tee "$OUT/timeline_loads.txt"
  [ -d .ab/kernels_src ] && timeout 200 $py benchmarks/with_kernels.py .ab/kernels_src benchmarks/timeline.py \
    --shapes 128:full:3840 128:causal:8192 --policies shift --out /tmp/timelines_ab.npz 2>&1 | tee "$OUT/timeline_ab.txt"
fi
if [ "$stage" = patches_bench ]; then   # each patch of $PATCHES as .abN in one call: all trees compile at once, then
  rm -rf .ab .ab[0-9]*; mkdir -p /tmp/pb; n=0   # the bits against this tree's, a short bench per tree (this tree first
  legs=(new)                                    # and last: the call's drift), the backward's tests where bits differ
  for pt in ${PATCHES:?names of benchmarks/patches/*.patch, without .patch}; do
    n=$((n + 1)); d=.ab$n; legs+=($d)
    mkdir -p $d && cp -r kernels_src $d/ && (cd $d && patch -s -p1 < ../benchmarks/patches/$pt.patch) || exit 1
    echo $pt > $d/name
  done
  for leg in "${legs[@]}"; do
    pre=(-m); [ $leg != new ] && pre=(benchmarks/with_kernels.py $leg/kernels_src)
    $py "${pre[@]}" cupy_dash compile --head-dim 64 --head-dim 128 -j 4 >/tmp/pb/compile_${leg#.}.log 2>&1 &
  done
  wait; tail -qn1 /tmp/pb/compile_*.log
  pbench() {   # $1 leg, $2 tag: head dims 64 and 128, full and causal, 4k and 16k, in one process; PB_SCHEDULES
               # (default auto): the schedules benched, e.g. "auto atomic"
    local leg=$1 tag=$2; local run=("$py" benchmarks/bench.py)
    [ $leg != new ] && run=("$py" benchmarks/with_kernels.py $leg/kernels_src benchmarks/bench.py)
    timeout 100 "${run[@]}" --hdims 64 128 --masks full causal --seqlens 4096 16384 --schedules ${PB_SCHEDULES:-auto} \
      --no-torch --no-fa3 --no-overhead --no-compile --repeats 15 --warmup 3 --input-sets 1 --out /tmp/pb/$tag.json 2>&1 \
      | grep -E "^\| cupy_dash (bwd|fwd)" | sed "s/^/$tag /" | tee -a "$OUT/patches_bench.log"
  }
  timeout 100 $py benchmarks/bits_digest.py --out /tmp/pb/bits_new.json >/tmp/pb/bits.log 2>&1
  pbench new new_first
  for leg in "${legs[@]:1}"; do
    pt=$(cat $leg/name)
    timeout 100 $py benchmarks/with_kernels.py $leg/kernels_src benchmarks/bits_digest.py --out /tmp/pb/bits_$pt.json \
      >>/tmp/pb/bits.log 2>&1
    echo "$leg = $pt: $($py benchmarks/bits_digest.py --compare /tmp/pb/bits_new.json /tmp/pb/bits_$pt.json)" \
      | tee -a "$OUT/patches_bench.log"
    pbench $leg $pt
  done
  pbench new new_last
  for leg in "${legs[@]:1}"; do   # xdist workers read ./kernels_src: swap it
    pt=$(cat $leg/name)
    [ -z "${PB_TESTS:-}" ] && $py benchmarks/bits_digest.py --compare /tmp/pb/bits_new.json /tmp/pb/bits_$pt.json \
      >/dev/null 2>&1 && continue   # PB_TESTS: test files under tests/gpu run even where the bits are the same
    rm -rf /tmp/pristine && cp -r kernels_src /tmp/pristine && rm -rf kernels_src && cp -r $leg/kernels_src kernels_src
    files=(); for f in ${PB_TESTS:-test_gpu_attention.py}; do files+=(tests/gpu/$f); done
    timeout -s INT -k 10 ${TEST_LIMIT:-200} $py -m pytest "${files[@]}" -q -rf -n 8 --maxfail=5 \
      -k "${PB_TEST_K:-backward and not 96}" -p no:cacheprovider 2>&1 | tail -4 | sed "s/^/$pt: /" | tee -a "$OUT/patches_bench.log"
    rm -rf kernels_src && cp -r /tmp/pristine kernels_src
  done
  (cd /tmp/pb && tar czf "$OUT/patches_bench.tgz" *.json *.md *.log)
fi
if [ "$stage" = legs_ab ]; then   # one patch ($AB_PATCH) against this tree, bench legs alternating tree / patch
  rm -rf .ab1 && mkdir -p .ab1 /tmp/la && cp -r kernels_src .ab1/ \
    && (cd .ab1 && patch -s -p1 < ../benchmarks/patches/${AB_PATCH:?a benchmarks/patches/*.patch name}.patch) || exit 1
  $py -m cupy_dash compile --head-dim 128 --kernel bwd_main -j 8 >/tmp/la/compile_new.log 2>&1 &
  $py benchmarks/with_kernels.py .ab1/kernels_src cupy_dash compile --head-dim 128 --kernel bwd_main -j 8 \
    >/tmp/la/compile_ab1.log 2>&1 & wait; tail -qn1 /tmp/la/compile_*.log
  for n in $(seq ${LEGS:-2}); do   # LEG_ARGS: bench.py's shape arguments (default: head dim 128, causal 2k-8k)
    for leg in new ab1; do
      run=("$py" benchmarks/bench.py); [ $leg = ab1 ] && run=("$py" benchmarks/with_kernels.py .ab1/kernels_src benchmarks/bench.py)
      timeout 100 "${run[@]}" ${LEG_ARGS:---hdims 128 --masks causal --seqlens 2048 4096 8192} --schedules auto \
        --no-torch --no-fa3 --no-overhead --no-compile --repeats 20 --warmup 3 --input-sets 1 \
        --out /tmp/la/${leg}_$n.json 2>&1 | grep -E "^\| cupy_dash (bwd|fwd)" | sed "s/^/$leg$n /" | tee -a "$OUT/legs_ab.log"
    done
  done
  (cd /tmp/la && tar czf "$OUT/legs_ab.tgz" *)
fi
if [ "$stage" = sections_auto ]; then   # auto against the sectioned fa3 table (and descending) at a steady clock,
  for d in ${SECTION_HDIMS:-64 128}; do   # causal 1k-4k: the evidence an auto rule for L2 sections needs
    timeout 200 $py benchmarks/steady_bench.py --hdim $d --no-fa3 --impls dash_det --schedules fa3 descending \
      --shapes ${SECTION_SHAPES:-causal:1024 causal:2048 causal:4096} --rounds 3 --loop-s 0.5 \
      --json "$OUT/steady_sched_d$d.json" --md "$OUT/steady_sched_d$d.md" 2>&1 | tail -4
  done
fi
if [ "$stage" = fwd_order ]; then   # the causal forward's launch order (FwdParams.head_section): its tests, the legs
  timeout -s INT -k 30 300 $py -m pytest tests/gpu/test_gpu_forward.py tests/gpu/test_gpu_jax_jit.py -q -ra "$@" \
    2>&1 | tee "$OUT/fwd_order_tests.log" | tail -4   # of benchmarks/fwd_order.py, then beside FA3's forward (FA3_WHL=1)
  for d in 128 64; do
    timeout 150 $py benchmarks/fwd_order.py --hdim $d ${ORDER_ARGS:-} --json "$OUT/fwd_order_d$d.json" --md "$OUT/fwd_order_d$d.md" \
      2>&1 | tail -6
  done
  timeout 200 $py benchmarks/steady_bench.py --forward --rounds 3 --loop-s 0.5 --shapes causal:1024 causal:2048 \
    causal:4096 causal:8192 causal:16384 full:1280 full:3840 full:15360 --json "$OUT/steady_fwd.json" \
    --md "$OUT/steady_fwd.md" 2>&1 | tail -10
fi
if [ "$stage" = steady_ab ]; then   # AB_PATCHES (<name>.patch in AB_PATCH_DIR, default benchmarks/patches) and
  # AB_CUBINS (folders of another NVRTC's cubins of this tree, benchmarks/with_nvrtc_cubins.py --record) against the
  # tree at a steady clock
  # (STEADY_IMPLS: steady_bench's --impls, default ours deterministic and FA3's non-deterministic backward):
  rm -rf /tmp/sab; mkdir -p /tmp/sab   # LEGS rounds of one process per leg, each timing ours deterministic beside
  [ -n "${AB_PATCHES:-}${AB_CUBINS:-}" ] || { echo "steady_ab: set AB_PATCHES or AB_CUBINS" >&2; exit 2; }
  for c in ${AB_CUBINS:-}; do
    [ -f "$c/nvrtc.json" ] || { echo "steady_ab: $c holds no recorded cubins (carry it)" >&2; exit 2; }
  done
  for p in ${AB_PATCHES:-}; do        # FA3's non-deterministic backward (FA3_WHL=1), the yardstick of its process
    mkdir -p .ab_$p && cp -r kernels_src docs .ab_$p/ &&
      (cd .ab_$p && patch -s -p1 <"../${AB_PATCH_DIR:-benchmarks/patches}/$p.patch")
  done
  for n in $(seq ${LEGS:-2}); do
    for leg in tree ${AB_PATCHES:-} ${AB_CUBINS:-}; do
      run=("$py"); name=$(basename "$leg"); name=${name#.}   # a hidden folder's reports would miss the tar below
      if [ -f "$leg/nvrtc.json" ]; then run=("$py" benchmarks/with_nvrtc_cubins.py --replay "$leg")
      elif [ "$leg" != tree ]; then run=("$py" benchmarks/with_kernels.py ".ab_$leg/kernels_src"); fi
      timeout 120 "${run[@]}" benchmarks/steady_bench.py ${STEADY_ARGS:---shapes causal:8192 causal:16384} \
        --impls ${STEADY_IMPLS:-dash_det fa3_nondet} --json /tmp/sab/${name}_$n.json --md /tmp/sab/${name}_$n.md \
        2>&1 | tail -4 | sed "s/^/${name}_$n /" | tee -a "$OUT/steady_ab.log"
      [ -f /tmp/sab/${name}_$n.json ] || echo "${name}_$n: no report (see above)" | tee -a "$OUT/steady_ab.log"
    done
  done
  (cd /tmp/sab && tar czf "$OUT/steady_ab.tgz" *)
fi
if [ "$stage" = tail_ab ]; then   # the causal tail (benchmarks/with_tail_tables.py R) against the tree's tables:
  mkdir -p /tmp/tab                 # LEGS rounds of one process per leg (tree, R = 1, R = 2), each timing ours
  for n in $(seq ${LEGS:-2}); do    # deterministic and atomic beside FA3's non-deterministic backward (FA3_WHL=1)
    for leg in tree ${TAIL_RS:-1 2}; do
      pre=(); [ $leg = tree ] || pre=(benchmarks/with_tail_tables.py $leg)
      timeout ${TAIL_LEG_S:-90} $py "${pre[@]}" benchmarks/steady_bench.py --impls dash_det dash_atomic fa3_nondet \
        --schedules symmetric_shift --rounds 3 --loop-s 0.5 \
        ${TAIL_ARGS:---shapes causal:2048 causal:4096 causal:8192 causal:16384} --json /tmp/tab/${leg}_$n.json \
        --md /tmp/tab/${leg}_$n.md 2>&1 | grep -v "^with_tail_tables" | tail -6 | sed "s/^/$leg$n /" \
        | tee -a "$OUT/tail_ab.log"
      [ -f /tmp/tab/${leg}_$n.json ] || echo "$leg$n: no report (timed out or failed)" | tee -a "$OUT/tail_ab.log"
    done
  done
  (cd /tmp/tab && tar czf "$OUT/tail_ab.tgz" *)
fi
if [ "$stage" = ncu_conflicts ]; then   # where the shared-memory bank conflicts and the mio throttle come from:
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | tail -1)   # causal 8k (B = 2) with the 80- and the
  mkdir -p /tmp/nc .ab_nodq && cp -r kernels_src .ab_nodq/   # 64-query tile, atomic, no bulk copies at all
  (cd .ab_nodq && patch -s -p1 <../benchmarks/patches/no_dq_add.patch)   # (no_dq_add), FA3 (FA3_WHL=1); full 3840
  m=l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum
  m=$m,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum
  m=$m,sm__cycles_elapsed.max,smsp__inst_executed.sum,smsp__sass_inst_executed_op_shared_gmma.sum
  m=$m,smsp__sass_inst_executed_op_shared_ld.sum,smsp__sass_inst_executed_op_global_ld.sum
  m=$m,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio   # (B = 4): ours and FA3, 80 x 128 both
  for leg in m80 m64 atomic nodq fa3 full_ours full_fa3; do
    run=($py); sched=auto; blk=80; kern=dash_bwd_main; args=(--impl ours); shape=(--causal --seqlen 8192 --batch 2)
    [ $leg = m64 ] && blk=64; [ $leg = atomic ] && sched=atomic
    [ $leg = nodq ] && run=($py benchmarks/with_kernels.py .ab_nodq/kernels_src)
    [ ${leg#full_} != $leg ] && shape=(--seqlen 3840 --batch 4)
    [ ${leg#full_} = fa3 ] && kern=regex:FlashAttnBwdSm90 && args=(--impl fa3)
    [ ${args[1]} = ours ] && args+=(--schedule $sched)
    CUPY_DASH_BWD_CAUSAL_BLOCK_M=$blk timeout 150 "$ncu" --profile-from-start off --clock-control none --metrics "$m" \
      --kernel-name-base demangled -k "$kern" -c 1 --csv "${run[@]}" benchmarks/ncu_bwd.py "${args[@]}" \
      "${shape[@]}" >/tmp/nc/$leg.csv 2>&1
    grep -E '"(l1tex|sm|smsp)__' /tmp/nc/$leg.csv | awk -F'","' '{print $(NF-2), $NF}' | tr -d '"' | sed "s/^/$leg /"
  done
  (cd /tmp/nc && tar czf "$OUT/ncu_conflicts.tgz" *)
fi
if [ "$stage" = short_modes ]; then   # a short shape's deterministic spread (full 1280 by default; SHORT_ARGS: other
  mkdir -p /tmp/sm                        # timing_modes.py shape arguments): five processes each of the deterministic
  for n in $(seq ${SHORT_N:-5}); do       # and the atomic backward, alternating, each with 1 s steady loops
    for mode in det atomic; do
      extra=(); [ $mode = atomic ] && extra=(--atomic)
      timeout 60 $py benchmarks/timing_modes.py ${SHORT_ARGS:---seqlen 1280 --tokens 15360} --variants sets1 keep \
        --calls 40 --loop-s 1 "${extra[@]}" --json /tmp/sm/${mode}_$n.json 2>&1 | tail -3 | sed "s/^/$mode$n /" \
        | tee -a "$OUT/short_modes.log"
    done
  done
  (cd /tmp/sm && tar czf "$OUT/short_modes.tgz" *)
fi
if [ "$stage" = engine_rest ]; then   # what quick_ab's tests leave out (head dim 96, soft-capping, fold, portable,
  mkdir -p /tmp/er                      # the timeline build's bits), then the timeline at full 3840 and causal 8k
  timeout -s INT -k 20 ${TEST_LIMIT:-200} $py -m pytest tests/gpu/test_gpu_attention.py tests/gpu/test_gpu_gqa.py \
    tests/gpu/test_gpu_varlen_bwd.py tests/gpu/test_gpu_window.py -q -rf -n 8 --maxfail=10 -p no:cacheprovider -k 96 \
    2>&1 | tee /tmp/er/tests_d96.log | tail -3
  timeout -s INT -k 20 ${TEST_LIMIT:-200} $py -m pytest tests/gpu/test_gpu_softcap.py tests/gpu/test_gpu_fold.py \
    tests/gpu/test_gpu_portable.py tests/gpu/test_gpu_timeline.py -q -rf -n 8 --maxfail=10 -p no:cacheprovider 2>&1 \
    | tee /tmp/er/tests_rest.log | tail -3
  timeout 150 $py benchmarks/timeline.py --shapes 128:full:3840 128:causal:8192 --policies shift \
    --out /tmp/er/timelines.npz >/tmp/er/timeline.txt 2>&1; grep -E "^d128|no GEMM|Q wait \||dS\^T, dV issue \|" /tmp/er/timeline.txt
  (cd /tmp/er && tar czf "$OUT/engine_rest.tgz" *.log *.txt)
fi
if [ "$stage" = quick_ab ]; then   # a kernel change in one call: the backward's tests on 8 workers (this tree), then
  for ab in .ab*; do              # the bits against .ab and engine_bench without ncu (.ab* compile meanwhile)
    [ -d $ab/kernels_src ] && $py benchmarks/with_kernels.py $ab/kernels_src cupy_dash compile --head-dim 64 \
      --head-dim 128 --kernel bwd_main -j 3 >/tmp/compile_${ab#.}.log 2>&1 &
  done
  timeout -s INT -k 20 ${TEST_LIMIT:-170} $py -m pytest tests/gpu/test_gpu_attention.py tests/gpu/test_gpu_gqa.py \
    tests/gpu/test_gpu_varlen_bwd.py tests/gpu/test_gpu_window.py -q -ra -n 8 --maxfail=5 -k "not 96" "$@" 2>&1 \
    | tee "$OUT/quick_tests.log" | tail -6
  wait
  if grep -qE "[0-9]+ (failed|error)" "$OUT/quick_tests.log"; then exit 1; fi
  NO_NCU=1; stage=engine_bench
fi
mkdir -p /tmp/eb
if [ -d .ab/kernels_src ] && { [ "$stage" = engine_bench ] || [ "$stage" = engine_bits ]; }; then   # bits of both, once
  [ -f /tmp/eb/bits_new.json ] || timeout 120 $py benchmarks/bits_digest.py --out /tmp/eb/bits_new.json >/tmp/eb/bits.log 2>&1
  [ -f /tmp/eb/bits_old.json ] || timeout 120 $py benchmarks/with_kernels.py .ab/kernels_src benchmarks/bits_digest.py \
    --out /tmp/eb/bits_old.json >>/tmp/eb/bits.log 2>&1
  $py benchmarks/bits_digest.py --compare /tmp/eb/bits_new.json /tmp/eb/bits_old.json | tee -a "$OUT/engine_bench.log"
  cp /tmp/eb/bits*.json "$OUT/"
fi
if [ "$stage" = engine_bench ]; then
  common="--no-torch --no-overhead --no-compile --schedules auto atomic --repeats 20 --warmup 3"
  for ver in new .ab*; do   # this tree (with FA3), then every carried .ab*/kernels_src (another tree's kernels)
    run=("$py" benchmarks/bench.py); fa3=""
    if [ $ver != new ]; then
      [ -d $ver/kernels_src ] || continue
      run=("$py" benchmarks/with_kernels.py $ver/kernels_src benchmarks/bench.py); fa3=--no-fa3; ver=${ver#.}
    fi
    timeout 240 "${run[@]}" --hdims 128 --masks full --seqlens 1280 3840 15360 --tokens 15360 $common $fa3 \
      --out /tmp/eb/${ver}_d128_full.json 2>&1 | tee -a "$OUT/engine_bench.log" | grep -E "bwd|fwd" | tail -12
    timeout 150 "${run[@]}" --hdims 128 --masks causal --seqlens 2048 8192 16384 $common $fa3 \
      --out /tmp/eb/${ver}_d128_causal.json 2>&1 | grep -E "bwd|fwd" | tee -a "$OUT/engine_bench.log" | tail -12
    [ $ver != new ] && [ -n "${AB_NO_D64:-}" ] && continue   # the .ab legs at head dim 128 only
    timeout 150 "${run[@]}" --hdims 64 --seqlens 1024 4096 16384 $common --no-fa3 \
      --out /tmp/eb/${ver}_d64.json 2>&1 | grep -E "bwd|fwd" | tee -a "$OUT/engine_bench.log" | tail -12
  done
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | tail -1)
  [ -n "${NO_NCU:-}" ] && ncu=true
  timeout 120 "$ncu" --profile-from-start off --clock-control none --set full --import-source no \
    -k dash_bwd_main -c 1 -f -o /tmp/eb/ours_causal8k $py benchmarks/ncu_bwd.py --impl ours --causal \
    --seqlen 8192 --batch 2 >/tmp/eb/ncu.log 2>&1
  "$ncu" -i /tmp/eb/ours_causal8k.ncu-rep --page details --csv >/tmp/eb/ours_causal8k.details.csv 2>&1
  "$ncu" -i /tmp/eb/ours_causal8k.ncu-rep --page raw --csv >/tmp/eb/ours_causal8k.raw.csv 2>&1
  "$ncu" -i /tmp/eb/ours_causal8k.ncu-rep --page source --csv --print-source sass >/tmp/eb/ours_causal8k.sass.csv 2>&1
  (cd /tmp/eb && tar czf "$OUT/engine_bench.tgz" *.json *.md *.csv ncu.log bits.log)
fi
if [ "$stage" = dq_writers ]; then   # two dQ writer warps (default) against one
  mkdir -p /tmp/dw
  timeout -s INT -k 30 120 $py -m pytest tests/gpu/test_gpu_attention.py tests/gpu/test_gpu_gqa.py tests/gpu/test_gpu_fold.py -q \
    -rf --maxfail=3 -p no:cacheprovider -k "(test_backward or bitwise or fold) and not small_grid and not d64" 2>&1 \
    | tee /tmp/dw/writers2_tests.log | tail -4
  if grep -qE "[0-9]+ (failed|error)" /tmp/dw/writers2_tests.log; then cp /tmp/dw/*.log "$OUT"; exit 1; fi
  ab=(--hdims 128 --masks full causal --seqlens 4096 16384 --schedules auto atomic --no-torch --no-fa3
      --no-overhead --no-compile --repeats 10 --warmup 2 --input-sets 1)
  for w in 2 1; do
    CUPY_DASH_BWD_DQ_WRITERS=$w timeout 70 $py benchmarks/bench.py "${ab[@]}" --out /tmp/dw/writers$w.json 2>&1 \
      | grep -E "^\| cupy_dash bwd" | head -4 | sed "s/^/W=$w /"
  done
  (cd /tmp/dw && tar czf "$OUT/dq_writers.tgz" *.json *.log)
fi
if [ "$stage" = fa3_bench ]; then   # the engine issue's benchmark, FA3 in the same call (FA3_WHL=1), every schedule
  mkdir -p /tmp/fb
  common=(--no-torch --no-overhead --no-compile --repeats 20 --warmup 3 --input-sets 1)
  timeout 215 $py benchmarks/bench.py --hdims 128 --masks full --seqlens 1280 3840 15360 "${common[@]}" \
    --out /tmp/fb/d128_full.json 2>&1 | tee /tmp/fb/d128_full.log | grep -E "^\| (cupy_dash|fa3) bwd" | head -8
  timeout 185 $py benchmarks/bench.py --hdims 128 --masks causal --seqlens 2048 8192 16384 "${common[@]}" \
    --out /tmp/fb/d128_causal.json 2>&1 | tee /tmp/fb/d128_causal.log | grep -E "^\| (cupy_dash|fa3) bwd" | head -8
  timeout 130 $py benchmarks/bench.py --hdims 64 --masks full causal --seqlens 1024 4096 16384 "${common[@]}" \
    --no-fa3 --out /tmp/fb/d64.json 2>&1 | tee /tmp/fb/d64.log | grep -E "^\| cupy_dash bwd" | head -8
  (cd /tmp/fb && tar czf "$OUT/fa3_bench.tgz" *)
fi
if [ "$stage" = fa3_full ]; then   # full mask beside FA3 (15360 tokens: 1280 / 3840 / 15360 divide it), softcap cost,
  mkdir -p /tmp/ff                   # the two-writer timeline, varlen under the sanitizer
  common=(--no-torch --no-overhead --no-compile --repeats 20 --warmup 3 --input-sets 1)
  timeout 200 $py benchmarks/bench.py --hdims 128 --masks full --seqlens 1280 3840 15360 --tokens 15360 "${common[@]}" \
    --out /tmp/ff/d128_full.json 2>&1 | tee /tmp/ff/d128_full.log | grep -E "^\| (cupy_dash|fa3|FA3).*bwd" | head -9
  for cap in 0 50; do
    timeout 80 $py benchmarks/bench.py --hdims 64 128 --masks full causal --seqlens 4096 16384 --schedules auto atomic \
      --softcap $cap --no-fa3 "${common[@]}" --out /tmp/ff/softcap$cap.json >/tmp/ff/softcap$cap.log 2>&1
    grep -E "^\| cupy_dash" /tmp/ff/softcap$cap.md | head -6 | sed "s/^/cap=$cap /"
  done
  timeout 70 $py benchmarks/timeline.py --shapes 128:causal:16384 --policies symmetric_shift \
    --out /tmp/ff/timelines.npz >/tmp/ff/timeline.log 2>&1; tail -8 /tmp/ff/timeline.log
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  timeout 140 "$san" --tool synccheck --error-exitcode 3 $py benchmarks/kernels_sanitize.py >/tmp/ff/synccheck.log 2>&1
  echo "synccheck rc=$? $(grep -c OK /tmp/ff/synccheck.log) OK, $(tail -1 /tmp/ff/synccheck.log)"
  (cd /tmp/ff && tar czf "$OUT/fa3_full.tgz" *.json *.md *.log)
fi
# "first" and "first2": the riskiest untested changes, each bounded (worst cases under the 600 s of a call); logs
# in first.tgz / first2.tgz
t() { local name=$1 limit=$2; shift 2; timeout "$limit" "$@" >"/tmp/first/$name.log" 2>&1; \
      echo "$name: rc=$? $(tail -1 /tmp/first/$name.log)"; }
if [ "$stage" = first ]; then
  mkdir -p /tmp/first
  t writers_d64 100 $py -m pytest tests/gpu/test_gpu_attention.py tests/gpu/test_gpu_fold.py -q -rf --maxfail=3 \
    -p no:cacheprovider -k "d64 and (test_backward or bitwise or fold) and not small_grid"
  t softcap 140 $py -m pytest tests/gpu/test_gpu_softcap.py tests/gpu/test_gpu_head_dims_probe.py -q -rf \
    --maxfail=5 -p no:cacheprovider
  t device_tables 140 $py -m pytest tests/gpu/test_gpu_fastpath.py tests/gpu/test_gpu_varlen_bwd.py \
    tests/gpu/test_gpu_compact.py -q -rf --maxfail=5 -p no:cacheprovider
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  t synccheck 150 "$san" --tool synccheck --error-exitcode 3 $py benchmarks/kernels_sanitize.py
  (cd /tmp/first && tar czf "$OUT/first.tgz" *.log)
fi
if [ "$stage" = first2 ]; then
  mkdir -p /tmp/first
  t transformers 240 $py -m pytest tests/gpu/test_gpu_transformers.py -q -rf --maxfail=5 -p no:cacheprovider
  t training_graphs 240 $py -m pytest tests/gpu/test_gpu_training_graphs.py -q -rf --maxfail=5 -p no:cacheprovider
  (cd /tmp/first && tar czf "$OUT/first2.tgz" *.log)
fi
if [ "$stage" = final ]; then   # the capture fix and the transformers test re-run, an ncu pair, more of the GPU suite
  mkdir -p /tmp/first
  t graphs 150 $py -m pytest tests/gpu/test_gpu_training_graphs.py tests/gpu/test_gpu_transformers.py -q -rf \
    -p no:cacheprovider -k "varlen or bitwise or captured"
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | tail -1)
  for impl in ours fa3; do
    kern=dash_bwd_main; [ $impl = fa3 ] && kern=regex:FlashAttnBwdSm90
    timeout 80 "$ncu" --profile-from-start off --clock-control none --set full --import-source no \
      --kernel-name-base demangled -k "$kern" -c 1 -f -o /tmp/first/${impl}_causal8k $py benchmarks/ncu_bwd.py \
      --impl $impl --causal --seqlen 8192 --batch 2 >/tmp/first/ncu_$impl.log 2>&1
    echo "ncu $impl rc=$?"
    "$ncu" -i /tmp/first/${impl}_causal8k.ncu-rep --page details --csv >/tmp/first/${impl}_causal8k.details.log 2>&1
    "$ncu" -i /tmp/first/${impl}_causal8k.ncu-rep --page raw --csv >/tmp/first/${impl}_causal8k.raw.log 2>&1
  done
  t rest 200 $py -m pytest tests/gpu/test_gpu_window.py tests/gpu/test_gpu_torch_ops.py tests/gpu/test_gpu_varlen.py \
    tests/gpu/test_gpu_gqa.py tests/gpu/test_gpu_jax_jit.py tests/gpu/test_gpu_forward.py -q -rf --maxfail=10 \
    -p no:cacheprovider
  (cd /tmp/first && tar czf "$OUT/final.tgz" *.log)
fi
if [ "$stage" = tile80 ]; then   # CUPY_DASH_BWD_FULL_BLOCK_M=80 (FA3's full-mask tile): its tests, then the A/B
  mkdir -p /tmp/first                # beside FA3 (FA3_WHL=1) at the full-mask shapes; logs in tile80.tgz
  t tests80 260 env CUPY_DASH_BWD_FULL_BLOCK_M=80 $py -m pytest tests/gpu/test_gpu_attention.py tests/gpu/test_gpu_gqa.py \
    tests/gpu/test_gpu_window.py tests/gpu/test_gpu_softcap.py tests/gpu/test_gpu_varlen_bwd.py -q -rf -x \
    -p no:cacheprovider -k "(d128 and full) or 128-full"
  ab=(--hdims 128 --masks full --seqlens 1280 3840 15360 --tokens 15360 --schedules auto shift symmetric_shift atomic
      --no-torch --no-overhead --no-compile --repeats 20 --warmup 3 --input-sets 1)
  for m in 80 64; do
    fa3=--no-fa3; [ $m = 64 ] && fa3=
    CUPY_DASH_BWD_FULL_BLOCK_M=$m timeout 150 $py benchmarks/bench.py "${ab[@]}" $fa3 --out /tmp/first/tile$m.json \
      >/tmp/first/tile$m.log 2>&1
    grep -E "^\| (cupy_dash|fa3|FA3).*bwd" /tmp/first/tile$m.md | head -9 | sed "s/^/m=$m /"
  done
  (cd /tmp/first && tar czf "$OUT/tile80.tgz" *.log *.json *.md)
fi
if [ "$stage" = d96 ]; then   # head dim 96 (the head-dim-128 kernels padded): its GPU tests, then its speed beside d128
  timeout -s INT -k 30 330 $py -m pytest tests/gpu/test_gpu_forward.py tests/gpu/test_gpu_attention.py tests/gpu/test_gpu_gqa.py \
    tests/gpu/test_gpu_varlen.py tests/gpu/test_gpu_varlen_bwd.py tests/gpu/test_gpu_softcap.py tests/gpu/test_gpu_fold.py \
    -q -rf --maxfail=10 -p no:cacheprovider -k 96 2>&1 | tee "$OUT/d96_tests.log" | tail -12
  timeout 220 $py benchmarks/bench.py --hdims 96 128 --masks full causal --seqlens 1024 4096 16384 --tokens 16384 \
    --hidden 1536 --schedules auto atomic --no-fa3 --no-overhead --no-compile --repeats 10 --warmup 2 --input-sets 1 \
    --out "$OUT/d96_bench.json" 2>&1 | grep -E "^\| cupy_dash" | head -16
fi
if [ "$stage" = head_dims_sweep ]; then   # every schedule and the atomic path at head dims 192 / 256 beside head dim
  mkdir -p /tmp/hds                       # 128's auto (SWEEP_SHAPES), then the bulk copies' ceiling (dq_reduce_bw.py)
  # and the cost of swapping partials between a CTA pair (dsmem_exchange.py)
  for hd in 192:3072 256:2048 128:2048; do
    d=${hd%:*}; sch=(--schedules shift symmetric_shift fa3 descending); [ "$d" = 128 ] && sch=()
    timeout 150 $py benchmarks/steady_bench.py --hdim "$d" --hidden "${hd#*:}" --no-fa3 --impls dash_det dash_atomic \
      "${sch[@]}" --shapes ${SWEEP_SHAPES:-causal:4096 causal:16384 full:16384:16384} --rounds 3 --loop-s 0.3 \
      --json /tmp/hds/sched_d$d.json --md /tmp/hds/sched_d$d.md 2>&1 | tail -4 | tee -a "$OUT/head_dims_sweep.log"
  done
  timeout 90 $py benchmarks/dq_reduce_bw.py --json /tmp/hds/dq_reduce_bw.json 2>&1 | tee -a "$OUT/head_dims_sweep.log"
  timeout 60 $py benchmarks/dsmem_exchange.py --json /tmp/hds/dsmem_exchange.json 2>&1 \
    | tee -a "$OUT/head_dims_sweep.log"
  (cd /tmp/hds && tar czf "$OUT/head_dims_sweep.tgz" *)
fi
