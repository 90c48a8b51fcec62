#!/usr/bin/env bash
# The quantizer launches with and without the pending patches, in one device call:
#   bash pending/time_quantizers.sh    (from the repository root; everything in $OUT/quant.tgz)
# Trees: main; 0002; 0001+0002 (0001 as timed before); 0001+0004+0002 (the form that lands);
# main again (the first and last main bound the drift).
set -uo pipefail
root=$PWD
make_tree() {  # name, patches...
    local dir=/tmp/trees/$1
    shift
    rm -rf "$dir" && mkdir -p "$dir" && cp -r "$root"/. "$dir"/
    (cd "$dir" && for p in "$@"; do patch -p1 -s --no-backup-if-mismatch < "$root/pending/$p"*.patch; done)
}
make_tree main
make_tree p2 0002
make_tree p12 0001 0002
make_tree p142 0001 0004 0002
trees="main p2 p12 p142 main"
for tree in $trees; do
    out=$OUT/$tree
    [[ -d $out ]] && out=$OUT/${tree}-again
    (cd /tmp/trees/$tree && PYTHONPATH=. timeout 120 python3 benchmarks/quantizer_bandwidth.py \
        --workloads eq8x8k,logu29-64k --recipes nvfp4,fp4 --out "$out" > "$out.log" 2>&1)
    echo "== $tree (exit $?)"
    grep -E "q\+k|  v |  do " "$out.log"
done
# at most 8 files come back from $OUT
names=$(for t in $trees main-again; do echo "$t $t.log"; done | tr '\n' ' ')
(cd "$OUT" && tar czf quant.tgz $names && rm -rf $names)
