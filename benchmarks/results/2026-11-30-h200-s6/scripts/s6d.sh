# Session 6, call 4: the new backward tiles (4-warp dK/dV on 64-key tiles, 4-warp dQ on 64-row tiles) and
# fp32 key factors in dQ. GPU 0: GPU tests, kernel tests on CUDA, kernel_check (correctness, graph, speed,
# profile), kernel-only variants. GPU 1: the FA4 set, training call, each provider timed alone, clocks logged.
set -u
date -u; nvidia-smi -L; git log --oneline -1
export PYTHONUNBUFFERED=1
mkdir -p /tmp/o /tmp/bundles && cp peer-bundles/fa4_cutlass_cu13_py312.tar.xz /tmp/bundles/
B=/tmp/bundles/fa4_cutlass_cu13_py312.tar.xz
(export CUDA_VISIBLE_DEVICES=1
 nvidia-smi dmon -i 1 -s pc -d 1 > /tmp/o/dmon_alone.txt 2>&1 & DM=$!
 BENCH_OUT=/tmp/o/alone timeout 200 benchmarks/run_h200.sh $B --providers flamia:mxfp8,fa4,fa2 --workloads causal --modes train,fwd,bwd,memory --alone > /tmp/o/alone.log 2>&1
 kill $DM
 timeout 60 python3 scratch/calls/host_time.py > /tmp/o/host_time.txt 2>&1) &
export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD
timeout 150 python3 -m pytest -q -m gpu tests/ --ignore=tests/test_peer_attention.py > /tmp/o/gpu_tests_all.log 2>&1; tail -2 /tmp/o/gpu_tests_all.log
timeout 90 python3 -m pytest -q tests/test_kernel_prefix.py tests/test_records.py tests/test_worklist.py tests/test_kernel_quantize.py tests/test_kernel_ops.py > /tmp/o/new_kernels_gpu.log 2>&1; tail -2 /tmp/o/new_kernels_gpu.log
timeout 200 python3 benchmarks/kernel_check.py --skip tune --out /tmp/o/kc > /tmp/o/kc.log 2>&1
grep -v Warn /tmp/o/kc.log | grep "^correctness\|^graph\|^|" | cut -c1-300
grep "^profile" /tmp/o/kc.log | cut -c1-300
C='[{}, {"dq_atomic":true}, {"bwd_stages":2}, {"bwd_stages":4}, {"dq_stages":2}]'
timeout 150 python3 scratch/calls/ab.py $PWD new "$C" eq8x8k,logu11-16k > /tmp/o/ab.jsonl 2> /tmp/o/ab.err
python3 -c '
import json
for l in open("/tmp/o/ab.jsonl"):
    r = json.loads(l); k = {n.split("_kernel")[0].lstrip("_")[:8]: round(x, 3) for n, x in list(r["kernels_ms"].items())[:4]}
    print(r["workload"][:10], json.dumps(r["cfg"]), "fwd %.3f bwd %.3f" % (r["fwd_ms"], r["bwd_ms"]), k)'
wait
grep -v Warn /tmp/o/host_time.txt
grep -A9 "## Training call" /tmp/o/alone/fa4/results.md | tail -7
grep -B2 -A9 "## Backward" /tmp/o/alone/fa4/results.md | tail -8
tar czf $OUT/s6d.tgz -C /tmp o
