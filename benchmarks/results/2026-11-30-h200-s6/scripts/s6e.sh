# Session 6, call 5 (final): the training call against the peers with each provider timed alone, kernel
# checks, host time, a last stages sweep. GPU 1: FA4 set then torch set. GPU 0: tests, kernel_check, sweep, host.
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1
mkdir -p /tmp/o /tmp/bundles && cp peer-bundles/fa4_cutlass_cu13_py312.tar.xz /tmp/bundles/
B=/tmp/bundles/fa4_cutlass_cu13_py312.tar.xz
(export CUDA_VISIBLE_DEVICES=1
 nvidia-smi dmon -i 1 -s pc -d 1 > /tmp/o/dmon.txt 2>&1 & DM=$!
 BENCH_OUT=/tmp/o/parts timeout 230 benchmarks/run_h200.sh $B --providers flamia:mxfp8,fa4,fa2 --workloads causal --modes train,fwd,bwd,memory --alone > /tmp/o/fa4_set.log 2>&1
 BENCH_OUT=/tmp/o/parts timeout 200 benchmarks/run_h200.sh torch --providers flamia:mxfp8,fa2,sdpa-nested --workloads causal --modes train,memory --alone > /tmp/o/torch_set.log 2>&1
 kill $DM) &
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD
timeout 150 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py > /tmp/o/gpu_tests_all.log 2>&1; tail -2 /tmp/o/gpu_tests_all.log
timeout 200 python3 benchmarks/kernel_check.py --skip tune --out /tmp/o/kc > /tmp/o/kc.log 2>&1
grep -v Warn /tmp/o/kc.log | grep "^correctness\|^graph\|^|" | cut -c1-300
grep "^profile" /tmp/o/kc.log | cut -c1-300
timeout 60 python3 scratch/calls/host_time.py > /tmp/o/host_time.txt 2>&1; grep -v Warn /tmp/o/host_time.txt
timeout 60 python3 -m flamia probe > /tmp/o/probe.log 2>&1; tail -4 /tmp/o/probe.log
timeout 100 python3 scratch/calls/ab.py $PWD new '[{}, {"bwd_stages":5}, {"bwd_stages":6}]' eq8x8k,logu11-16k > /tmp/o/ab.jsonl 2> /tmp/o/ab.err
python3 -c '
import json
for l in open("/tmp/o/ab.jsonl"):
    r = json.loads(l); k = {n.split("_kernel")[0].lstrip("_")[:8]: round(x, 3) for n, x in list(r["kernels_ms"].items())[:3]}
    print(r["workload"][:10], json.dumps(r["cfg"]), "fwd %.3f bwd %.3f" % (r["fwd_ms"], r["bwd_ms"]), k)'
wait
for t in fa4 torch; do grep -A9 "## Training call" /tmp/o/parts/$t/results.md | tail -7; done
tar czf $OUT/s6e.tgz -C /tmp o
