# Session 10, call 7: ncu of the three Gluon attention kernels at 53d8d60 on eq8x8k (one launch each): where each
# step's cycles go, for the next session's plan.
set -u
date -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
for name in dkdv_gluon_kernel dq_gluon_kernel attn_fwd_gluon_kernel; do
  timeout 100 ncu --kernel-name regex:"^$name\$" --launch-skip 1 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section ComputeWorkloadAnalysis --print-details all python3 benchmarks/kernel_check.py --once eq8x8k --tiles '{}' > /tmp/o/ncu_eq8x8k_$name.txt 2>&1
  echo "== $name"; grep -E "Duration|Issue Slots Busy|Stall|Eligible Warps|Active Warps Per|Warp Cycles Per Issued|Executed Ipc A|Pipe Utilization|Tensor|SM Busy|Registers Per" /tmp/o/ncu_eq8x8k_$name.txt | grep -v "^ *-" | head -40
done
tar czf $OUT/s10g.tgz -C /tmp o
