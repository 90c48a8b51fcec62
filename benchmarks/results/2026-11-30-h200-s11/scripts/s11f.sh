# Session 11, call 6: at f68c139. GPU 1: a second sample of the training call with FA4 (each provider alone) on
# another machine than call 5. GPU 0: ncu of the three Gluon attention kernels on eq8x8k (one launch each).
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1
mkdir -p /tmp/o /tmp/bundles && cp peer-bundles/fa4_cutlass_cu13_py312.tar.xz /tmp/bundles/
B=/tmp/bundles/fa4_cutlass_cu13_py312.tar.xz
(export CUDA_VISIBLE_DEVICES=1
 BENCH_OUT=/tmp/o/parts timeout 150 benchmarks/run_h200.sh $B --providers flamia:mxfp8,fa4,fa2 --workloads causal --modes train --alone > /tmp/o/fa4_set.log 2>&1) &
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD
for name in dkdv_gluon_kernel dq_gluon_kernel attn_fwd_gluon_kernel; do
  timeout 100 ncu --kernel-name regex:"^$name\$" --launch-skip 1 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section ComputeWorkloadAnalysis --print-details all python3 benchmarks/kernel_check.py --once eq8x8k --tiles '{}' > /tmp/o/ncu_eq8x8k_$name.txt 2>&1
  echo "== $name"; grep -E "Duration|Issue Slots Busy|Stall (Long|Short|Wait|Barrier|Math|Not Sel|MIO|Dispatch|Branch|Selected|GMMA|Sleeping)|Eligible Warps|Warp Cycles Per Issued|Tensor|Registers Per|Local Memory Spilling" /tmp/o/ncu_eq8x8k_$name.txt | grep -v "^ *-" | head -24
done
wait
grep -A9 "## Training call" /tmp/o/parts/fa4/results.md | tail -7
tar czf $OUT/s11f.tgz -C /tmp o
