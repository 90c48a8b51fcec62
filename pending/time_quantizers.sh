#!/usr/bin/env bash
# The quantizer launches with and without each pending patch, in one device call:
#   bash pending/time_quantizers.sh    (from the repository root; results under $OUT/<tree>)
# Trees: main, 0001, 0002, both, then main again (the first and last main bound the drift);
# everything in $OUT/quant.tgz.
set -uo pipefail
root=$PWD
make_tree() {  # name, patches...
    local dir=/tmp/trees/$1
    shift
    rm -rf "$dir" && mkdir -p "$dir" && cp -r "$root"/. "$dir"/
    (cd "$dir" && for p in "$@"; do patch -p1 -s --no-backup-if-mismatch < "$root/pending/$p"*.patch; done)
}
make_tree main
make_tree p0001 0001
make_tree p0002 0002
make_tree both 0001 0002
for tree in main p0001 p0002 both main; do
    out=$OUT/$tree
    [[ -d $out ]] && out=$OUT/${tree}-again
    (cd /tmp/trees/$tree && PYTHONPATH=. timeout 150 python3 benchmarks/quantizer_bandwidth.py \
        --workloads eq8x8k,logu29-64k --recipes nvfp4,fp4 --out "$out" > "$out.log" 2>&1)
    echo "== $tree (exit $?)"
    grep -E "q\+k|  v |  do " "$out.log"
done
# at most 8 files come back from $OUT
(cd "$OUT" && tar czf quant.tgz main* p000* both* && rm -rf main* p000* both*)
