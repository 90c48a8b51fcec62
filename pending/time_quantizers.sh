#!/usr/bin/env bash
# The quantizer launches with and without the pending patches, in one device call:
#   bash pending/time_quantizers.sh    (from the repository root; everything in $OUT/quant.tgz)
# Trees: main, 0001, 0001+0002, 0001+0002+0003 at its cap of 184 registers and at 176 and 168,
# then main again (the first and last main bound the drift).
set -uo pipefail
root=$PWD
make_tree() {  # name, cap or -, patches...
    local dir=/tmp/trees/$1 cap=$2
    shift 2
    rm -rf "$dir" && mkdir -p "$dir" && cp -r "$root"/. "$dir"/
    (cd "$dir" && for p in "$@"; do patch -p1 -s --no-backup-if-mismatch < "$root/pending/$p"*.patch; done)
    if [[ $cap != - ]]; then
        sed -i "s/score_codes_maxnreg: int | None = 184/score_codes_maxnreg: int | None = $cap/" \
            "$dir/flamia/kernels/configs.py"
        grep -q "= $cap\$" "$dir/flamia/kernels/configs.py" || echo "make_tree $1: the cap did not take"
    fi
}
make_tree main -
make_tree p0001 - 0001
make_tree p0002 - 0001 0002
make_tree cap184 - 0001 0002 0003
make_tree cap176 176 0001 0002 0003
make_tree cap168 168 0001 0002 0003
for tree in main p0001 p0002 cap184 cap176 cap168 main; do
    out=$OUT/$tree
    [[ -d $out ]] && out=$OUT/${tree}-again
    (cd /tmp/trees/$tree && PYTHONPATH=. timeout 120 python3 benchmarks/quantizer_bandwidth.py \
        --workloads eq8x8k,logu29-64k --recipes nvfp4,fp4 --out "$out" > "$out.log" 2>&1)
    echo "== $tree (exit $?)"
    grep -E "q\+k|  v |  do " "$out.log"
done
# at most 8 files come back from $OUT
(cd "$OUT" && tar czf quant.tgz main* p000* cap* && rm -rf main* p000* cap*)
