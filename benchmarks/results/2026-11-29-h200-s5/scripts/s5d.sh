# Session 5, call 4: GPU 1 = the cuDNN + FlashInfer set with main (5eae5cc); GPU 0 = where the
# eager training call's host time goes (torch.profiler, CPU and CUDA).
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1
mkdir -p /tmp/bundles /tmp/o && cp peer-bundles/flashinfer074_cudnnfe_py312.tar.xz /tmp/bundles/
(CUDA_VISIBLE_DEVICES=1 BENCH_OUT=/tmp/o/parts timeout 480 benchmarks/run_h200.sh /tmp/bundles/flashinfer074_cudnnfe_py312.tar.xz \
  --workloads causal --modes train,fwd,bwd,memory > /tmp/o/cudnn_set.log 2>&1) &
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD
timeout 120 python3 scratch/calls/cpu_profile.py > /tmp/o/cpu_profile.txt 2>&1; cat /tmp/o/cpu_profile.txt | cut -c1-120
wait
tail -3 /tmp/o/cudnn_set.log
grep -A9 "## Training call" /tmp/o/parts/cudnn-flashinfer/results.md | tail -7
tar czf $OUT/s5d.tgz -C /tmp o
