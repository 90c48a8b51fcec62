#!/usr/bin/env bash
# Time flamia against one set of peers on a GPU machine (written for an H200; see README.md).
#
#   benchmarks/run_h200.sh SET [flamia bench options...]
#   benchmarks/run_h200.sh merge A/results.json B/results.json [--out DIR]
#
# SET is one of
#   torch                 flamia MXFP8, FA2 varlen (aten), SDPA on nested tensors, SageAttention 1 (if installed)
#   flex                  flamia MXFP8, FlexAttention (compiles per workload: the slow one)
#   PATH/flashinfer074_cudnnfe_py312.tar.xz   flamia MXFP8, cuDNN BF16 + FP8, FlashInfer BF16 + FP8
#   PATH/fa4_cutlass_cu13_py312.tar.xz        flamia MXFP8, FlashAttention-4 BF16
# A bundle is unpacked and installed into /tmp/site first (shared/wheels/README.md), which
# is why one invocation runs one set: the device takes one bundle per call. Options after
# SET go to `flamia bench` and override the defaults (e.g. --workloads logu29-64k,
# --modes train, --providers flamia:mxfp8,cudnn). Results land in
# ${BENCH_OUT:-benchmarks/results/parts}/TAG/ (torch, flex, cudnn-flashinfer or fa4); merge them after.
set -euo pipefail

usage() { sed -n '2,16p' "$0" >&2; exit 2; }
[[ $# -ge 1 ]] || usage
set_name="$1"
shift
if [[ "$set_name" == *.tar.xz ]]; then
    [[ -f "$set_name" ]] || { echo "run_h200.sh: no bundle at $set_name" >&2; exit 2; }
    set_name="$(cd "$(dirname "$set_name")" && pwd)/$(basename "$set_name")"
fi
cd "$(dirname "$0")/.."  # the repository root: flamia imports from here, results land here

SITE=/tmp/site
bench() {
    # pip --target skips .pth files, and nvidia-cutlass-dsl needs its .pth to find cutlass:
    # site.addsitedir runs the .pth files under $SITE before flamia imports any peer.
    python3 -c 'import site, sys
site.addsitedir(sys.argv[1])
from flamia.bench.run import main
sys.exit(main(sys.argv[2:]))' "$SITE" "$@"
}

if [[ "$set_name" == merge ]]; then
    bench --merge "$@"
    exit 0
fi

case "$(basename "$set_name")" in
    torch) tag=torch; providers=flamia:mxfp8,fa2,sdpa-nested,sage1 ;;
    flex) tag=flex; providers=flamia:mxfp8,flex ;;
    flashinfer074_cudnnfe_py312.tar.xz) tag=cudnn-flashinfer; providers=flamia:mxfp8,cudnn,flashinfer ;;
    fa4_cutlass_cu13_py312.tar.xz) tag=fa4; providers=flamia:mxfp8,fa4 ;;
    *) echo "run_h200.sh: unknown set '$set_name'" >&2; usage ;;
esac

if [[ "$set_name" == *.tar.xz ]]; then
    unpacked=$(mktemp -d)
    tar xJf "$set_name" -C "$unpacked"
    python3 -m pip install -q --no-deps --no-index --target "$SITE" "$unpacked"/*.whl
    rm -rf "$unpacked"
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv
bench --providers "$providers" --out "${BENCH_OUT:-benchmarks/results/parts}/$tag" --peek "$@"
