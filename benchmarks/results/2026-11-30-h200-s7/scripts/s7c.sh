# Session 7, call 3: ncu of the dK/dV and dQ kernels at HEAD (38f8be1): is dK/dV bound by L2 traffic, issue or waits?
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
NCU="ncu --kernel-name regex:_dkdv_kernel|_dq_kernel --launch-skip 2 --launch-count 2 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Chart"
timeout 240 $NCU python3 benchmarks/kernel_check.py --once eq8x8k > /tmp/o/ncu.txt 2>&1
grep -E "^  _|Duration|Registers Per|Stall|Issued Ipc|Issue Slots Busy|Achieved Occ|Compute \(SM\) Thr|Memory Thr|L2 Cache Thr|L1/TEX Cache Thr|DRAM Thr|Warp Cycles Per Issued|No Eligible|L2 Hit|Mem Busy|Max Bandwidth|Mem Pipes" /tmp/o/ncu.txt | head -80
tar czf $OUT/s7c.tgz -C /tmp o
