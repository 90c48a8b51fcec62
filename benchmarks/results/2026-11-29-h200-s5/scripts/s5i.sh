# Session 5, call 9: why a run that times FA4 measures flamia and FA2 slower. Same GPU, one after
# the other, training call only: (1) the FA4 set's install with flamia and FA2 timed, FA4 not;
# (2) FA4 alone; (3) all three in one run, as call 3 did.
set -u
date -u; nvidia-smi -L
export PYTHONUNBUFFERED=1
mkdir -p /tmp/bundles /tmp/o && cp peer-bundles/fa4_cutlass_cu13_py312.tar.xz /tmp/bundles/
B=/tmp/bundles/fa4_cutlass_cu13_py312.tar.xz
for p in flamia:mxfp8,fa2 fa4 flamia:mxfp8,fa4,fa2; do
  tag=$(echo $p | tr ':,' '__')
  BENCH_OUT=/tmp/o/$tag timeout 120 benchmarks/run_h200.sh $B --providers $p --workloads causal --modes train > /tmp/o/$tag.log 2>&1
  echo "== $p"; grep -A9 "## Training call" /tmp/o/$tag/fa4/results.md | tail -7; grep -i spread /tmp/o/$tag/fa4/results.md
done
tar czf $OUT/s5i.tgz -C /tmp o
