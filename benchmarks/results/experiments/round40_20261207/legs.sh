# Sourced by call2.sh and call5.sh after benchmarks/device_env.sh: patches the legs named in LEGS (patches/<leg>.patch)
# into copies of kernels_src under /tmp/legs/<leg>, and compiles the tree's and every leg's bwd_main for the head
# dims in HDIMS (default 128) side by side, each compile's last line appended to $O/log.txt.
R=benchmarks/results/experiments/round40_20261207
for leg in $LEGS; do
  rm -rf /tmp/legs/$leg && mkdir -p /tmp/legs/$leg && cp -r kernels_src /tmp/legs/$leg/ \
    && patch -s -d /tmp/legs/$leg -p1 < $R/patches/$leg.patch || exit 1
done
c="cupy_dash compile $(for d in ${HDIMS:-128}; do printf -- "--head-dim %s " $d; done)--kernel bwd_main -j 5"
python3 -m $c > /tmp/c_tree.log 2>&1 &
for leg in $LEGS; do python3 benchmarks/with_kernels.py /tmp/legs/$leg/kernels_src $c > /tmp/c_$leg.log 2>&1 & done
wait; tail -qn1 /tmp/c_*.log | tee -a $O/log.txt
