#!/usr/bin/env bash
# The whole peer suite in one command, on a machine that holds both wheel bundles: every set
# of run_h200.sh in turn on one GPU, then one merged table.
#
#   benchmarks/run_all.sh BUNDLE_DIR [OUT]
#
# BUNDLE_DIR holds flashinfer074_cudnnfe_py312.tar.xz and fa4_cutlass_cu13_py312.tar.xz
# (shared/wheels/build_bundles.sh BUNDLE_DIR builds them). OUT defaults to
# benchmarks/results/<date>-all. Every provider of the registry, flamia's emulated recipes
# included; the six causal workloads; train, fwd and bwd, and peak memory. WORKLOADS and MODES
# (flamia bench's --workloads and --modes) widen or narrow it, e.g. WORKLOADS=all.
set -euo pipefail
[[ $# -ge 1 ]] || { sed -n '2,11p' "$0" >&2; exit 2; }
bundles=$(cd "$1" && pwd)
for bundle in flashinfer074_cudnnfe_py312.tar.xz fa4_cutlass_cu13_py312.tar.xz; do
    [[ -f "$bundles/$bundle" ]] || { echo "run_all.sh: no $bundle in $bundles" >&2; exit 2; }
done
cd "$(dirname "$0")/.."
out=${2:-benchmarks/results/$(date -u +%F)-all}
parts=$(mktemp -d)
export BENCH_OUT=$parts
cells=(--workloads "${WORKLOADS:-causal}" --modes "${MODES:-train,fwd,bwd,memory}")
start=$(date +%s)
# flamia MXFP8 runs in every set, so each row's paired rounds include it; the torch set also
# times the emulated recipes (n/a on the workloads whose padded batch is too large for them).
benchmarks/run_h200.sh torch "${cells[@]}" --providers flamia,fa2,sdpa-nested,sage1
benchmarks/run_h200.sh flex "${cells[@]}"
benchmarks/run_h200.sh "$bundles/flashinfer074_cudnnfe_py312.tar.xz" "${cells[@]}"
benchmarks/run_h200.sh "$bundles/fa4_cutlass_cu13_py312.tar.xz" "${cells[@]}"
benchmarks/run_h200.sh merge "$parts"/{torch,flex,cudnn-flashinfer,fa4}/results.json --out "$out"
echo "run_all.sh: $(( $(date +%s) - start )) s; results in $out"
