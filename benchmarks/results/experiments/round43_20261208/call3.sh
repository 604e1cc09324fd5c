# Round 43, call 3 (carry .whl; ~4 min with the start): the keep rules after the spread rotations (21e8bd4)
# where its tables changed besides the bench's shapes: varlen (64- and 80-query tiles) and GQA.
# Leg "plain": the tree with patches/unspread.patch (the rotations before 21e8bd4; same kernels), built in /tmp/old
# and put first on PYTHONPATH. Two alternating processes per leg: benchmarks/varlen_bwd.py (equal and random lengths,
# 4 / 16 / 64 sequences, auto) and steady_bench.py --group 4 (ours deterministic); KEEP_S: no new process after it
# (seconds, default 330). $OUT: keep.tgz, log.txt.
. benchmarks/device_env.sh
R=benchmarks/results/experiments/round43_20261208
rm -rf /tmp/old && mkdir /tmp/old && tar --exclude=./.whl -cf - . | tar -xf - -C /tmp/old
(cd /tmp/old && git apply $OLDPWD/$R/patches/unspread.patch && python3 setup.py build_ext --inplace -j 16 \
  > /tmp/old_build.log 2>&1) || { echo "plain leg: build failed"; tail -5 /tmp/old_build.log; exit 1; }
python3 $R/tables_check.py | tee -a $O/log.txt
PYTHONPATH=/tmp/old:$PYTHONPATH python3 $R/tables_check.py | tee -a $O/log.txt
T=/tmp/keep; mkdir -p $T
for n in 1 2; do
  for leg in tree plain; do
    [ $SECONDS -gt ${KEEP_S:-330} ] && break 2
    pp=$PYTHONPATH; [ $leg = plain ] && pp=/tmp/old:$PYTHONPATH
    PYTHONPATH=$pp timeout 90 python3 benchmarks/varlen_bwd.py --kinds equal random --seqs 4 16 64 --schedules auto \
      --json $T/varlen_${leg}_$n.json 2>&1 | tail -12 | sed "s/^/$leg $n /" | tee -a $O/log.txt
    PYTHONPATH=$pp timeout 60 python3 benchmarks/steady_bench.py --group 4 --impls dash_det --rounds 3 --loop-s 0.3 \
      --shapes full:3840 causal:2048 causal:8192 --json $T/gqa_${leg}_$n.json 2>&1 | grep -E "^(full|causal)|rror" \
      | sed "s/^/$leg $n gqa /" | tee -a $O/log.txt
    (cd $T && tar czf $O/keep.tgz *.json)
  done
done
echo "call3: $SECONDS s" | tee -a $O/log.txt
