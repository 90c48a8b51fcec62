# Session 8, call 3: the CUDA fwd test failure (HEAD vs now), ncu of both forwards on eq8x8k.
set -u
date -u
export PYTHONUNBUFFERED=1
mkdir -p /tmp/o
(cd scratch/calls/t_old && PYTHONPATH=$PWD timeout 100 python3 -m pytest -q tests/test_kernel_fwd.py 2>&1 | tail -3) | tee /tmp/o/fwd_tests_head.txt
PYTHONPATH=$PWD timeout 150 python3 -m pytest -q tests/test_kernel_fwd.py 2>&1 | grep -v "^  \|^$" | tail -40 > /tmp/o/fwd_tests_now.txt; grep -i "error\|assert\|passed\|failed\|mismatch" /tmp/o/fwd_tests_now.txt | head -20
export PYTHONPATH=$PWD
for k in attn_fwd_gluon_kernel:'{}' _attn_fwd_kernel:'{"fwd_gluon":false}'; do
  name=${k%%:*}; cfg=${k#*:}
  timeout 120 ncu --kernel-name regex:$name --launch-skip 2 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section ComputeWorkloadAnalysis --section LaunchStats --print-details all python3 scratch/calls/fwd_only.py eq8x8k "$cfg" > /tmp/o/ncu_$name.txt 2>&1
  echo "== $name"; grep -E "Duration|Busy|Stall|Eligible|Occupancy|Registers|Warp Cycles|Issued|Shared Memory Config|Block Limit|Dynamic Shared|Static Shared" /tmp/o/ncu_$name.txt | grep -v "^ *-" | head -45
done
tar czf $OUT/s8c.tgz -C /tmp o
