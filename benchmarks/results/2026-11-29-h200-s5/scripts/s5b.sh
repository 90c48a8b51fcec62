# Session 5, call 2: next/work-grids with the one-launch tile list and the int32 cummax.
# GPU 0 = GPU tests, kernel_check (correctness, graph, speed, profile with totals and launch counts);
# GPU 1 = a flamia-only train bench *while* GPU 0 works (does the other GPU's load move timings?).
# Then, GPU 0 idle: the branch vs FA4 and FA2 (train, fwd, bwd, memory), then main's flamia (train), on GPU 1.
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1
mkdir -p /tmp/bundles /tmp/o/wg /tmp/o/main && cp peer-bundles/fa4_cutlass_cu13_py312.tar.xz /tmp/bundles/
ROOT=$PWD
B=/tmp/bundles/fa4_cutlass_cu13_py312.tar.xz
(export CUDA_VISIBLE_DEVICES=1
 cd $ROOT/scratch/wg && BENCH_OUT=/tmp/o/wg/busy timeout 200 benchmarks/run_h200.sh $B \
  --providers flamia:mxfp8 --workloads causal --modes train > /tmp/o/wg/busy.log 2>&1) &
export CUDA_VISIBLE_DEVICES=0
cd $ROOT/scratch/wg
PYTHONPATH=$PWD timeout 200 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py > /tmp/o/wg/gpu_tests.log 2>&1; tail -3 /tmp/o/wg/gpu_tests.log
PYTHONPATH=$PWD timeout 170 python3 benchmarks/kernel_check.py --skip tune,sass --out /tmp/o/wg/kc > /tmp/o/wg/kc.log 2>&1
grep -v Warn /tmp/o/wg/kc.log | grep "^correctness\|^graph\|^|" | cut -c1-600
grep "^profile" /tmp/o/wg/kc.log | cut -c1-400
wait
echo "== busy"; grep -A9 "## Training call" /tmp/o/wg/busy/fa4/results.md | tail -7
export CUDA_VISIBLE_DEVICES=1
BENCH_OUT=/tmp/o/wg/bench timeout 240 benchmarks/run_h200.sh $B \
  --providers flamia:mxfp8,fa4,fa2 --workloads causal --modes train,fwd,bwd,memory > /tmp/o/wg/bench.log 2>&1
cd $ROOT && BENCH_OUT=/tmp/o/main/bench timeout 120 benchmarks/run_h200.sh $B \
  --providers flamia:mxfp8 --workloads causal --modes train > /tmp/o/main/bench.log 2>&1
echo "== wg alone"; grep -A9 "## Training call" /tmp/o/wg/bench/fa4/results.md | tail -7
echo "== main alone"; grep -A9 "## Training call" /tmp/o/main/bench/fa4/results.md | tail -7
grep -i spread /tmp/o/*/bench/fa4/results.md /tmp/o/wg/busy/fa4/results.md
tar czf $OUT/s5b.tgz -C /tmp o
