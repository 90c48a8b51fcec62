#!/usr/bin/env bash
# The whole peer suite in one command, on a machine that holds both wheel bundles (no
# 64 MiB carry limit there): every set of run_h200.sh in turn, then one merged table.
#
#   benchmarks/run_all.sh BUNDLE_DIR [OUT]
#
# BUNDLE_DIR holds flashinfer074_cudnnfe_py312.tar.xz and fa4_cutlass_cu13_py312.tar.xz
# (shared/wheels/build_bundles.sh BUNDLE_DIR builds them). OUT defaults to
# benchmarks/results/<date>-all. The causal, non-causal, GQA and d=64 workloads; train, fwd
# and bwd, and peak memory (the flex set: the training call only, it compiles per workload).
set -euo pipefail
[[ $# -ge 1 ]] || { sed -n '2,11p' "$0" >&2; exit 2; }
bundles=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
out=${2:-benchmarks/results/$(date -u +%F)-all}
parts=$(mktemp -d)
export BENCH_OUT=$parts
modes=train,fwd,bwd,memory
workloads=causal,noncausal,gqa,d64
start=$(date +%s)
benchmarks/run_h200.sh torch --workloads "$workloads" --modes "$modes"
benchmarks/run_h200.sh flex --workloads "$workloads" --modes train
benchmarks/run_h200.sh "$bundles/flashinfer074_cudnnfe_py312.tar.xz" --workloads "$workloads" --modes "$modes"
benchmarks/run_h200.sh "$bundles/fa4_cutlass_cu13_py312.tar.xz" --workloads "$workloads" --modes "$modes"
benchmarks/run_h200.sh merge "$parts"/*/results.json --out "$out"
echo "run_all.sh: $(( $(date +%s) - start )) s; results in $out"
