"""Tile configurations of the attention kernels, as frozen dataclasses.

Some tile sizes are numerics, not only speed: the emulator reads them from here so that it
stays tile-faithful (NUMERICS.md 3-4). ``fwd_block_n`` sets where the online row max may
rise; ``bwd_block_m`` is the query step of the dK/dV loop, the extent of the transposed dO
exponent and of the per-key scale of the dK payload G; ``dq_block_n`` is the key step of the
dQ loop, the extent of the per-row scale of the dQ payload.
"""
from dataclasses import asdict, dataclass

from ..tiling import NumericsTiles, numerics_tiles


@dataclass(frozen=True)
class AttnTiles(NumericsTiles):
    """Tiles of one head dim.

    Measured on: one NVIDIA H200 (torch 2.11, Triton 3.6), 2026-11-29, eq8x8k causal, d=128,
    kernel-only, one change at a time from fwd 128x128 / 8 warps / 3 stages and bwd
    128 keys x 64 queries, dQ 128 x 64, 8 warps, 2 stages (benchmarks/results/
    2026-11-29-h200-kernel-check): fwd 217 TFLOP/s -> 246 with 4 warps (64-key tiles 207,
    2 stages 66); bwd 88 -> 114 with 32-query steps (64-key tiles 73, 64-row dQ tiles 68,
    32-key dQ steps 92, 1 stage 96). Re-swept after the aligned layout and the in-kernel
    rotate-back (same machine and versions, 2026-11-29, kernel_check.py's TUNE): fwd 320 ->
    428 TFLOP/s with 64-row query tiles (8 warps 334, 64-key tiles 246, 2 or 4 stages
    174-188), bwd 147 -> 181 with 3 stages (64-query steps 112, 4 warps 51, 128-key dQ steps
    136). Re-checked after the records of kernels/records.py (2026-11-29, eq8x8k, kernel-only):
    bwd 264 TFLOP/s against 255 with 64-query steps and 258 with 128-key dQ steps; fwd 491
    against 408 with 128-row tiles and 8 warps. Session 6 (same machine and versions,
    2026-11-30, kernel-only, CUDA ms per kernel, benchmarks/results/2026-11-30-h200-s6): one
    warpgroup per program and two programs per SM, each kernel's own warps and stages
    (``dq_warps``, ``dq_stages``): dK/dV on 64-key tiles with 4 warps 13.03 -> 11.33 ms, dQ on
    64-row tiles with 4 warps 8.00 -> 7.17 ms on eq8x8k (logu11-16k and skew8k+224x256 alike);
    at 255 registers per thread, 128 threads fit twice in the register file, 256 once. Then
    4 stages for dK/dV 11.97 -> 10.89 ms (2 stages 12.79; dQ with 2 stages 6.43 -> 7.05; dQ
    through atomics, now possible with 64-key tiles: dK/dV 25.9 ms, no dQ kernel). Session 7
    (same machine and versions, benchmarks/results/2026-11-30-h200-s7): 64-query dK/dV steps
    on the one-warpgroup structure 14.6-20.0 ms (2-4 stages) against 10.5; after the
    backward's factor moves (call 9, CUDA ms): dK/dV 9.95 against 10.76 with 3 stages, dQ 5.97
    against 8.18 with 4 stages and 6.80 with 2, forward 4.18 against 6.31 with 4 stages.
    Session 8 (same machine and versions, benchmarks/results/2026-11-30-h200-s8, eq8x8k):
    the Gluon forward 3.64 ms of CUDA time against the Triton one's 4.14 (call 4); in it
    (forward launcher medians), 128-key tiles 3.72 against 4.24 with 64-key tiles, 2 stages
    4.37, 64-key tiles with 4 stages 4.28 (call 2). The Gluon dQ 5.61 ms of CUDA time against
    the Triton one's 5.67, with 2 or 4 stages level (call 5). Session 9 (same machine and
    versions, benchmarks/results/2026-11-30-h200-s9): dK/dV in Gluon on 64-query steps with 2
    stages (the shared memory of 3 would leave one program per SM), 3-10% less CUDA time than
    the Triton kernel on 32-query steps on the five workloads measured (call 9; the figures are at
    ``dkdv_gluon``); 32-query steps with 2, 3 or 4 stages were level (call 2). d=64 has its
    own tiles (``TILES_D64``, below)."""

    # fwd_block_m, fwd_block_n, bwd_block_m, bwd_block_n, dq_block_m, dq_block_n: NumericsTiles
    fwd_warps: int = 4
    fwd_stages: int = 3
    bwd_warps: int = 4
    bwd_stages: int = 2
    dq_warps: int = 4
    dq_stages: int = 3
    # The forward in Gluon (attn_fwd_gluon.py) on the GPU: one warpgroup on 64-row tiles, key
    # tiles a multiple of 32 (its P^ V^ steps). The Triton kernel otherwise, and always under
    # the interpreter; both give the same bits.
    fwd_gluon: bool = True
    # dQ in Gluon (attn_dq_gluon.py) on the GPU, on the same terms: 4 warps, 64-row tiles,
    # key steps a multiple of 32.
    dq_gluon: bool = True
    # dK/dV in Gluon (attn_dkdv_gluon.py) on the GPU: 4 warps, 64-key tiles, query steps of
    # 32 or 64 (a 64-query step runs its S^T and dP^T in two 32-query halves and chains dV's
    # and dK's products over both); dQ through atomics stays with the Triton kernel. Both give
    # the same bits. CUDA ms of the kernel, H200, 2026-11-30, interleaved medians (benchmarks/
    # results/2026-11-30-h200-s9, call 9), Gluon at 64-query steps / Triton at 32 (the shipped
    # kernel before) / Gluon at 32: eq4x4k 1.337 / 1.395 / 1.466, eq8x8k 9.65 / 9.97 / 10.57,
    # skew8k+224x256 2.173 / 2.355 / 2.312, logu11-16k 1.062 / 1.176 / 1.122, logu29-64k
    # 5.51 / 6.13 / 5.88. The Triton kernel at 64-query steps spills (14.6-20.0 ms on eq8x8k,
    # session 7). Then the query records read without the document-end select (same machine,
    # session 10 call 2, interleaved medians, before / after): eq4x4k 1.344 / 1.257, eq8x8k
    # 9.574 / 8.903, skew8k+32x256 1.457 / 1.360, skew8k+224x256 2.180 / 2.099, logu11-16k
    # 1.061 / 1.004, logu29-64k 5.471 / 5.141.
    dkdv_gluon: bool = True
    # The Gluon dK/dV's register cap (ptxas .maxnreg; None: the compiler's choice, 255 at both
    # head dims; the Triton dK/dV, its bitwise twin, keeps the compiler's). A 4-warp program at
    # 255 registers fits twice in an SM's register file, at 168 three times; below what the
    # kernel needs, ptxas spills (TILES_D64 has the measurements; the forward and dQ at d=128
    # capped at 168 spilled 118 and 319 instructions offline, the forward on 64-key tiles so
    # capped took 27-46% more time, session 13 call 5).
    dkdv_maxnreg: int | None = None
    # dQ from the dK/dV kernel's tiles, added with fp32 atomics (5 MMAs per pair instead of
    # 7, no dQ kernel; dQ's summation order then varies from run to run). The dQ payload's
    # scale spans the key tile, hence dq_block_n == bwd_block_n. Off: slower on the same
    # machine (2026-11-29, kernel-only backward, TFLOP/s): eq8x8k 152 against 180 (and 167.5
    # against 198.0 with the PTX E4M3 rounding), logu11-16k 133.8 against 150.9, skew8k+224x256
    # level (111.3 / 112.0); ~17 GB of fp32 atomics on eq8x8k cost about what the dQ
    # kernel's whole recompute does.
    dq_atomic: bool = False

    def __post_init__(self):
        if self.dkdv_gluon and (self.bwd_block_n, self.bwd_warps, self.bwd_block_m in (32, 64), self.dq_atomic) != (
                64, 4, True, False):
            raise ValueError(f"dkdv_gluon: the Gluon dK/dV kernel runs 4 warps on 64-key tiles, query steps of 32 "
                             f"or 64 and no dQ atomics, got bwd_block_n={self.bwd_block_n}, "
                             f"bwd_warps={self.bwd_warps}, bwd_block_m={self.bwd_block_m}, "
                             f"dq_atomic={self.dq_atomic}; set dkdv_gluon=False for the Triton kernel")
        if self.dq_gluon and (self.dq_block_m, self.dq_warps, self.dq_block_n % 32) != (64, 4, 0):
            raise ValueError(f"dq_gluon: the Gluon dQ kernel runs 4 warps on 64-row tiles and key steps a multiple "
                             f"of 32, got dq_block_m={self.dq_block_m}, dq_warps={self.dq_warps}, "
                             f"dq_block_n={self.dq_block_n}; set dq_gluon=False for the Triton kernel")
        if self.fwd_gluon and (self.fwd_block_m, self.fwd_warps, self.fwd_block_n % 32) != (64, 4, 0):
            raise ValueError(f"fwd_gluon: the Gluon forward runs 4 warps on 64-row tiles and key tiles a multiple "
                             f"of 32, got fwd_block_m={self.fwd_block_m}, fwd_warps={self.fwd_warps}, "
                             f"fwd_block_n={self.fwd_block_n}; set fwd_gluon=False for the Triton kernel")
        if self.dkdv_maxnreg is not None and not 64 <= self.dkdv_maxnreg <= 255:
            raise ValueError(f"dkdv_maxnreg: a register count per thread in [64, 255] (or None), "
                             f"got {self.dkdv_maxnreg}")
        if self.dq_atomic and self.dq_block_n != self.bwd_block_n:
            raise ValueError(f"dq_atomic: the dQ payload's key step is the dK/dV key tile, so dq_block_n "
                             f"({self.dq_block_n}) must equal bwd_block_n ({self.bwd_block_n})")


@dataclass(frozen=True)
class QuantizerTiles:
    """The Q/K/V quantizer's program: ``operand_unit`` tokens of one head (a multiple of the
    32-token scale block; not numerics) with ``rotated_warps`` warps when the Hadamard
    rotation is on (Q and K), ``plain_warps`` otherwise (V).

    Measured on: one NVIDIA H200 (torch 2.11, Triton 3.6), 2026-11-30, kernel-only, bf16
    [65536, 16, 128], codes bitwise equal in every configuration (benchmarks/results/
    2026-11-30-h200-s6/qsweep.jsonl). With the Hadamard rotation (Q, K) the butterflies
    bound it: 64 tokens x 4 warps 0.489 ms (1.10 TB/s) -> 32 x 2 0.368 ms (1.46 TB/s) on
    eq8x8k (32 x 4 0.405, 32 x 8 0.470, 64 x 8 0.446, 128 x 8 0.555). Without (V) it runs at
    the copy bandwidth's 75-81% in every configuration near these (64 x 4 0.158 ms, 32 x 2
    0.159 ms on eq8x8k; 0.176 and 0.192 ms on skew8k+224x256), so all three operands share
    one program shape and one tile list. Then 1 warp (call 9, ``qsweep_w1.jsonl``): rotated
    0.368 -> 0.315 ms on eq8x8k, 0.378 -> 0.328 on skew8k+224x256; plain 0.159 -> 0.166 and
    0.192 -> 0.187, so V keeps 2. At 1 warp the rotated program spills (255 registers,
    88 LDL/STL by ``benchmarks/sass_offline.py``) and is faster all the same. Since session 7
    the rotated launch on the GPU is the Gluon kernel of ``rotated_quantizer.py`` (a token row
    per thread, so ``operand_unit`` is a multiple of 32 x ``rotated_warps``): 0.316 -> 0.235 ms on eq8x8k,
    bitwise equal (benchmarks/results/2026-11-30-h200-s7, call 5); session 9 made its loads
    and stores coalesced (rotated_quantizer.py): 0.233 -> 0.184 ms per launch on eq8x8k
    (benchmarks/results/2026-11-30-h200-s9, call 4). ``transposed_parts``: the rotated
    launch's transposed codes leave in that many pieces of head-dim rows, after which the row
    codes (session 11, call 3, ``qab.jsonl``, do_bench medians of 3 interleaved rounds, 32-token
    document starts): 4 pieces 0.1659 ms on eq8x8k, 2 pieces 0.1844, the whole tile before the
    row codes (254 registers) 0.1867; logu29-64k 0.1651 / 0.1826 / 0.1852; bitwise equal."""

    operand_unit: int = 32
    rotated_warps: int = 1
    transposed_parts: int = 4
    plain_warps: int = 2

    def __post_init__(self):
        if self.transposed_parts not in (1, 2, 4):
            raise ValueError(f"transposed_parts: a piece of D / parts head-dim rows must fill the transposed store's "
                             f"16-row layout at D = 64, so parts is 1, 2 or 4, got {self.transposed_parts}")
        if self.operand_unit % (32 * self.rotated_warps) or not 32 <= self.operand_unit <= 512:
            raise ValueError(f"operand_unit: the rotated launch holds a token row per thread and stores 16 tokens "
                             f"per thread transposed, so it must be a multiple of 32 * rotated_warps "
                             f"({32 * self.rotated_warps}) in [32, 512], got {self.operand_unit}")


# d=64, measured on one NVIDIA H200 (torch 2.11, Triton 3.6), 2026-11-30, the six causal d64 workloads,
# kernel-only CUDA ms, medians of 5 interleaved rounds, one change at a time from the d=128 tiles
# (benchmarks/results/2026-11-30-h200-s13, calls 3-4). Half the head dim leaves registers: 64-key
# forward tiles with 4 stages take 164 registers (three programs per SM; 128-key tiles 241), forward
# 4-16% less (eq8x8k 2.889 -> 2.721, skew8k+224x256 0.737 -> 0.617); dQ with 2 stages 2.9-4.9% less;
# the dK/dV capped at 168 registers (three programs per SM, 67 spill instructions offline) 2.6-6.1%
# less (eq8x8k 6.131 -> 5.757), with 3 stages less so. Together, against the d=128 tiles: forward
# 3.6-16%, dK/dV 2.1-5.7%, dQ 2.8-4.8% less (call 4). Caps of 128 (four programs per SM): forward
# level, dQ 13-16% and dK/dV 39-43% more (the forward's and dQ's caps set at the launch for the
# measurement, not kept as fields). 128-key dQ steps against 64-key ones, both at 2 stages: eq8x8k
# 4% less, skew8k+224x256 8% more. A cap changes no arithmetic (every output bit the same); 64-key
# forward tiles move where the row max may rise, which the emulator follows.
TILES_D64 = AttnTiles(**asdict(numerics_tiles(64)), fwd_stages=4, dq_stages=2, dkdv_maxnreg=168)
TILES = {64: TILES_D64, 128: AttnTiles(**asdict(numerics_tiles(128)))}
QUANTIZER = QuantizerTiles()
SUPPORTED_HEAD_DIMS = tuple(TILES)


def tiles_for(head_dim: int) -> AttnTiles:
    if head_dim not in TILES:
        raise ValueError(f"head_dim: the kernels support {SUPPORTED_HEAD_DIMS}, got {head_dim}")
    return TILES[head_dim]
