# Session 9, call 7: the refactored bitwise Gluon tests; ncu of the Gluon and Triton dK/dV on
# eq8x8k and logu29-64k (one launch each), for the next session's plan.
set -u
date -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
timeout 100 python3 -m pytest -q -m gpu tests/test_kernel_bwd.py -k "gluon" -p no:cacheprovider 2>&1 | tail -2 | tee /tmp/o/tests.txt
for w in eq8x8k logu29-64k; do
for k in dkdv_gluon_kernel:'{"dkdv_gluon_below":1073741824}' _dkdv_kernel:'{"dkdv_gluon":false}'; do
  name=${k%%:*}; cfg=${k#*:}
  timeout 110 ncu --kernel-name regex:"^$name\$" --launch-skip 1 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --print-details all python3 benchmarks/kernel_check.py --once $w --tiles "$cfg" > /tmp/o/ncu_${w}_$name.txt 2>&1
  echo "== $w $name"; grep -E "Duration|Issue Slots Busy|Stall|Eligible Warps|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|L2 Hit|L1/TEX Hit|Mem Busy|Max Bandwidth|Block Limit Reg|Block Limit Shared" /tmp/o/ncu_${w}_$name.txt | grep -v "^ *-" | head -30
done; done
tar czf $OUT/s9g.tgz -C /tmp o
