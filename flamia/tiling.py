"""The tile extents that are numerics, one source for the kernels and the emulator.

Tiles start at the document start (NUMERICS.md 3-4), and some of their extents decide
rounding, not only speed: where the forward's online row max may rise, which tiles are
diagonal, and how far a scale of the backward's payloads spans. The emulator
(``flamia.reference``) follows exactly these; the kernels' ``AttnTiles``
(``flamia.kernels.configs``) extends them with what only changes speed (warps, stages,
which kernel runs) and takes its per-head-dim extents from ``NUMERICS_TILES``.
"""
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class NumericsTiles:
    """Tile extents (rows or keys, from the document start) of the forward, the dK/dV loop
    and the dQ loop.

    fwd_block_m, fwd_block_n: the forward's query and key tiles. The key tile is where the
        row max may rise (NUMERICS.md 3, step 2); together they decide the diagonal tiles,
        where the 4-bit routes keep E4M3 P (nvfp4) or per-key V scales (fp4).
    fwd_diag_block_n: the keys over which the diagonal tiles are decided instead (None:
        fwd_block_n; a multiple of it), so that shorter key tiles keep wider diagonal tiles.
    bwd_block_m: the dK/dV loop's query step: the extent of the transposed dO's exponent
        and of the dK payload's per-key scale (NUMERICS.md 4).
    bwd_block_n: the dK/dV loop's key tile. No rounding depends on it alone; it is the
        dQ payload's key step when dQ goes through atomics, and the emulator's backward
        visits keys in steps of lcm(bwd_block_n, dq_block_n).
    dq_block_m, dq_block_n: the dQ loop's query tile and key step; the key step is the
        extent of the dQ payload's per-row scale, and both decide the dQ loop's diagonal
        tiles, where fp4's K takes per-key scales.
    """

    fwd_block_m: int = 64
    fwd_block_n: int = 128
    bwd_block_m: int = 64
    bwd_block_n: int = 64
    dq_block_m: int = 64
    dq_block_n: int = 64
    fwd_diag_block_n: int | None = None

    def __post_init__(self):
        if self.fwd_diag_block_n is not None and (self.fwd_diag_block_n <= 0
                                                  or self.fwd_diag_block_n % self.fwd_block_n):
            raise ValueError(f"fwd_diag_block_n: a positive multiple of fwd_block_n = {self.fwd_block_n} "
                             f"(or None), got {self.fwd_diag_block_n}")

    @property
    def diag_block_n(self) -> int:
        """The keys of a diagonal forward tile (``fwd_diag_block_n``, else the key tile)."""
        return self.fwd_diag_block_n or self.fwd_block_n

    def sizes(self) -> tuple[int, ...]:
        """Every extent (the emulator pads documents to their common multiple)."""
        return (self.fwd_block_m, self.fwd_block_n, self.bwd_block_m, self.bwd_block_n,
                self.dq_block_m, self.dq_block_n, self.diag_block_n)


# Per head dim the kernels support; d=64 runs 64-key forward tiles (kernels/configs.py has the
# measurements that chose them).
NUMERICS_TILES = {64: NumericsTiles(fwd_block_n=64), 128: NumericsTiles()}
# The recipes whose kernels multiply BF16 codes (bf16, and fp4's decoded 4-bit values): at
# d=128, 64-key forward tiles and 32-query dK/dV steps, whose operands take half an SM's
# shared memory, so two programs share an SM; bf16's dQ takes 64-key steps, fp4's 32 (its
# diagonal dQ tiles set where K takes per-key scales). docs/PERFORMANCE.md.
BF16_NUMERICS_TILES = {64: NUMERICS_TILES[64], 128: NumericsTiles(fwd_block_n=64, bwd_block_m=32, dq_block_n=64)}
FP4_NUMERICS_TILES = {64: NUMERICS_TILES[64], 128: replace(BF16_NUMERICS_TILES[128], dq_block_n=32)}
# The mixed NVFP4 recipe (BF16 score codes beside E4M3 P, V and gradients): at d=128 bf16's
# tiles, which fit two programs per SM, with diagonal tiles of 128 keys, which decide which
# pairs keep E4M3 P (64-key ones cost accuracy; docs/PERFORMANCE.md).
NVFP4_NUMERICS_TILES = {64: NUMERICS_TILES[64], 128: replace(BF16_NUMERICS_TILES[128], fwd_diag_block_n=128)}
# The recipes on tiles of their own (every other recipe takes NUMERICS_TILES).
RECIPE_TILES = {"bf16": BF16_NUMERICS_TILES, "fp4": FP4_NUMERICS_TILES, "nvfp4": NVFP4_NUMERICS_TILES}


def numerics_tiles(head_dim: int, recipe: str = "mxfp8") -> NumericsTiles:
    """The kernels' extents at ``head_dim`` for the recipe named ``recipe``; the d=128 ones
    at a head dim the kernels lack (the emulator runs any multiple of 16 up to 256)."""
    table = RECIPE_TILES.get(recipe, NUMERICS_TILES)
    return table.get(head_dim, table[128])
