# Session 11, call 1 (prepared in session 10): run from a checkout of branch next/tree-reductions.
# The forward's tree row reductions: bitwise Gluon vs Triton forward, forward vs emulator (gpu tests), then an
# interleaved A/B against main's forward (scratch/calls/main_fwd_gluon.py + main_fwd_math.py, made with git show main:...).
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p /tmp/o
W=eq4x4k,eq8x8k,skew8k+32x256,skew8k+224x256,logu11-16k,logu29-64k
( CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py > /tmp/o/gpu_tests.log 2>&1; tail -1 /tmp/o/gpu_tests.log
grep -E "FAILED|Error" /tmp/o/gpu_tests.log | head -5
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 benchmarks/kernel_check.py --skip tune,sass --out /tmp/o/kc > /tmp/o/kc.log 2>&1
grep -v Warn /tmp/o/kc.log | grep "^correctness" | cut -c1-330
) > /tmp/o/gpu0.out 2>&1 &
export CUDA_VISIBLE_DEVICES=1
C=scratch/calls
timeout 150 python3 $C/ab5.py fwd '[{"name":"tree"},{"name":"main","modules":[["_main_fwd_math","'$C'/main_fwd_math.py"]],"swap":[["attn_fwd","attn_fwd_gluon_kernel","'$C'/main_fwd_gluon.py"]]}]' $W 5 > /tmp/o/ab5_fwd.jsonl 2> /tmp/o/ab5_fwd.err
cut -c1-140 /tmp/o/ab5_fwd.jsonl; tail -1 /tmp/o/ab5_fwd.err
# The V and Q/K quantizers on equal vs packed lengths (packed runs at 64-65% of copy bandwidth against 70-71% equal).
for w in eq8x8k skew8k+224x256 logu29-64k; do for name in _quantize_operand_kernel rotated_operand_kernel; do
  timeout 60 ncu --kernel-name regex:"^$name\$" --launch-skip 1 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section LaunchStats --section Occupancy --section WarpStateStats --print-details all python3 benchmarks/kernel_check.py --once $w --tiles '{}' > /tmp/o/ncu_${w}_$name.txt 2>&1
  echo "== $w $name"; grep -E "^ *(Duration|DRAM Throughput|Memory Throughput|L2 Hit Rate|L1/TEX Hit Rate|Grid Size|Block Size|Registers Per|Achieved Occupancy|Waves Per SM|Warp Cycles Per Issued|Mem Busy|Max Bandwidth)" /tmp/o/ncu_${w}_$name.txt | head -16
done; done
wait; cat /tmp/o/gpu0.out
tar czf $OUT/s11a.tgz -C /tmp o
