# Session 5, call 1: branch next/work-grids on a GPU for the first time. GPU 0 = its GPU tests and
# kernel_check (correctness, speed, profile), then main's kernel_check speed+profile for comparison;
# GPU 1 = the branch vs FA4 (train/fwd/bwd), then main's flamia alone (train) in the same call.
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1
mkdir -p /tmp/bundles /tmp/o/wg /tmp/o/main && cp peer-bundles/fa4_cutlass_cu13_py312.tar.xz /tmp/bundles/
ROOT=$PWD
(export CUDA_VISIBLE_DEVICES=1
 cd $ROOT/scratch/wg && BENCH_OUT=/tmp/o/wg/bench timeout 300 benchmarks/run_h200.sh /tmp/bundles/fa4_cutlass_cu13_py312.tar.xz \
  --providers flamia:mxfp8,fa4 --workloads causal --modes train,fwd,bwd > /tmp/o/wg/bench.log 2>&1
 cd $ROOT && BENCH_OUT=/tmp/o/main/bench timeout 200 benchmarks/run_h200.sh /tmp/bundles/fa4_cutlass_cu13_py312.tar.xz \
  --providers flamia:mxfp8 --workloads causal --modes train,fwd,bwd > /tmp/o/main/bench.log 2>&1) &
export CUDA_VISIBLE_DEVICES=0
cd $ROOT/scratch/wg
PYTHONPATH=$PWD timeout 200 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py > /tmp/o/wg/gpu_tests.log 2>&1; tail -3 /tmp/o/wg/gpu_tests.log
PYTHONPATH=$PWD timeout 170 python3 benchmarks/kernel_check.py --skip tune,sass,graph --out /tmp/o/wg/kc > /tmp/o/wg/kc.log 2>&1
grep -v Warn /tmp/o/wg/kc.log | grep "^correctness\|^|\|^profile" | cut -c1-1200
cd $ROOT
PYTHONPATH=$PWD timeout 120 python3 benchmarks/kernel_check.py --skip correctness,tune,sass,graph --out /tmp/o/main/kc > /tmp/o/main/kc.log 2>&1
grep -v Warn /tmp/o/main/kc.log | grep "^|\|^profile" | cut -c1-1200
wait
for t in wg main; do echo "== $t"; grep -A9 "## Training call" /tmp/o/$t/bench/fa4/results.md | head -10; done
tar czf $OUT/s5a.tgz -C /tmp o
