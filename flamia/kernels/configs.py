"""Tile configurations of the attention kernels, as frozen dataclasses.

Some tile sizes are numerics, not only speed: they come from ``flamia/tiling.py``, which the
emulator reads too, so that it stays tile-faithful (NUMERICS.md 3-4). ``fwd_block_n`` sets where the online row max may
rise; ``bwd_block_m`` is the query step of the dK/dV loop, the extent of the transposed dO
exponent and of the per-key scale of the dK payload G; ``dq_block_n`` is the key step of the
dQ loop, the extent of the per-row scale of the dQ payload.
"""
from dataclasses import asdict, dataclass, replace

import torch
import triton.language as tl

from ..tiling import NumericsTiles, numerics_tiles
from .layout import DOC_ALIGN


@dataclass(frozen=True)
class OperandFormat:
    """What the attention kernels multiply: the dtype of every code tensor, of P and of the
    gradient payloads, as ``torch_dtype`` and as the kernels' ``CODES`` constexpr (``codes``).
    E4M3 codes carry power-of-two exponents per token block; BF16 values carry none (every
    exponent is 0, NUMERICS.md 4's BF16 line), so one kernel family serves every recipe (``Route``)."""

    name: str
    torch_dtype: torch.dtype
    codes: tl.dtype


E4M3 = OperandFormat("e4m3", torch.float8_e4m3fn, tl.float8e4nv)
BF16 = OperandFormat("bf16", torch.bfloat16, tl.bfloat16)


@dataclass(frozen=True)
class Route:
    """The formats of one recipe's kernels: ``codes`` of V, dO, P, G and the transposed Q and
    K; ``scores``, the row codes of Q and K in S = Q K^T; ``p4``: P is 4-bit off the diagonal
    tiles (NUMERICS.md 6). The mixed NVFP4 route multiplies its scores' NVFP4 values in BF16
    (Hopper has no FP4 MMA) and everything else as the MXFP8 route does. ``all4``: the
    all-4-bit route, every operand decoded to BF16 with its scales folded in (exponents 0):
    4-bit P on every tile, V (in P V) and K (in dQ) with per-key scales on diagonal tiles, G
    rounded to E2M1 in groups of 16 (``grad_mode``)."""

    codes: OperandFormat
    scores: OperandFormat
    p4: bool = False
    all4: bool = False
    # The Q/K quantizer's SCORES, what the row codes of Q and K hold: 0 codes in ``scores``
    # == ``codes``; 1 NVFP4 values (the mixed route, ``fp4.score_codes``) or 2 BF16 codes
    # (``Recipe.bf16_scores``), both on the tokens' E4M3 exponents and stored as BF16.
    score_codes: int = 0
    # dOt^ stored as BF16 values, its E4M3 codes times their step's 2^edOt (exact), so dV's
    # product P^T dOt^ runs in BF16 and accumulates inside the MMA (NUMERICS.md 4).
    dot_values: bool = False

    @property
    def rows(self) -> bool:
        """The backward's products over tokens read Q^, K^ and dO^ row tiles (BF16 wgmma takes
        MN-major operands; the all-4-bit route's transposed codes hold other values), so the
        quantizers write no Q^T, K^T or dOt^ (NUMERICS.md 4a)."""
        return self.codes == BF16 and not self.all4


# the recipes the kernels run
ROUTES = {"mxfp8": Route(E4M3, E4M3), "bf16": Route(BF16, BF16),
          "nvfp4": Route(E4M3, BF16, p4=True, score_codes=1, dot_values=True),
          "fp4": Route(BF16, BF16, p4=True, all4=True)}
# Recipe(name, bf16_scores=True): the mixed NVFP4 route's kernels with BF16 codes in S, with
# (nvfp4) or without (mxfp8) 4-bit P (NUMERICS.md 3a)
BF16_SCORES = {"mxfp8": Route(E4M3, BF16, score_codes=2), "nvfp4": Route(E4M3, BF16, p4=True, score_codes=2)}


def route_for(recipe) -> Route:
    """The route of a recipe the kernels run (a ``flamia.Recipe``)."""
    return (BF16_SCORES if recipe.bf16_scores else ROUTES)[recipe.name]


def p4_mode(recipe, forward: bool) -> int:
    """The kernels' P4 for a recipe (a ``flamia.Recipe`` the kernels run) in one direction: 0
    no 4-bit P (also the backward of ``fwd_p4_bwd_p8``); 1 off the diagonal tiles; 2 on every
    tile with group maxima over masked keys too (``p4_scale_before_mask``); 3 on every tile,
    group maxima over the visible keys (the all-4-bit route)."""
    route = route_for(recipe)
    if not route.p4 or (not forward and recipe.fwd_p4_bwd_p8):
        return 0
    return 2 if recipe.p4_scale_before_mask else 3 if route.all4 else 1


def row_sum_mode(recipe) -> int:
    """The forward's ROW_SUM for a recipe: what the row sum l adds per key tile; 0 the fp32 p
    (NUMERICS.md 3, step 5); 1 the 4-bit values on 4-bit tiles (``p4_sum_quantized``); 2 the
    values of the P codes without the V fold, on every tile (``p_sum_codes``)."""
    return 2 if recipe.sums_codes else 1 if recipe.p4_sum_quantized else 0


def grad_mode(recipe) -> int:
    """The kernels' GRAD4 for a recipe: 0 G in the operand format; 1 E2M1 in groups of 16,
    nearest; 2 E2M1 in groups of 16, stochastic (``Recipe.rounds_grad_stochastically``)."""
    if not route_for(recipe).all4:
        return 0
    return 2 if recipe.rounds_grad_stochastically else 1


def format_of(codes: torch.Tensor) -> OperandFormat:
    """The format of a code tensor, from its dtype (the launchers' one source of it)."""
    for fmt in (E4M3, BF16):
        if codes.dtype == fmt.torch_dtype:
            return fmt
    raise ValueError(f"codes: dtype must be one of {[E4M3.torch_dtype, BF16.torch_dtype]}, got {codes.dtype}")


@dataclass(frozen=True)
class AttnTiles(NumericsTiles):
    """Tiles of one head dim, and which kernel runs each pass on the GPU.

    The defaults are d=128's: 64-row forward query tiles on 128-key tiles, and each backward
    kernel on one warpgroup (4 warps) with 64-key dK/dV tiles and 64-row dQ tiles, so that
    two programs at 255 registers share an SM's register file and one program's softmax runs
    under the other's MMAs. Each value is the fastest of a one-change-at-a-time sweep on one
    NVIDIA H200 with Triton 3.6; docs/PERFORMANCE.md has the figures. d=64 has its own tiles
    (``TILES_D64``, below)."""

    # fwd_block_m, fwd_block_n, bwd_block_m, bwd_block_n, dq_block_m, dq_block_n, fwd_diag_block_n:
    # NumericsTiles
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
    # the same bits.
    dkdv_gluon: bool = True
    # The Gluon dK/dV's register cap (ptxas .maxnreg; None: the compiler's choice, 255 at both
    # head dims; the Triton dK/dV, its bitwise twin, keeps the compiler's). A 4-warp program at
    # 255 registers fits twice in an SM's register file, at 168 three times; below what the
    # kernel needs, ptxas spills, which at d=128 costs more than a third program gains.
    dkdv_maxnreg: int | None = None
    # dQ from the dK/dV kernel's tiles, added with fp32 atomics (5 MMAs per pair instead of
    # 7, no dQ kernel; dQ's summation order then varies from run to run). The dQ payload's
    # scale spans the key tile, hence dq_block_n == bwd_block_n. Off: slower. In the Triton
    # dK/dV kernel, the one with the path, the payload's transpose, per-query exponent and
    # product per step cost three times the whole dQ kernel, the atomics little
    # (docs/PERFORMANCE.md, dQ).
    dq_atomic: bool = False

    def __post_init__(self):
        super().__post_init__()
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
        transposed_steps = {"fwd_block_n": self.fwd_block_n, "bwd_block_m": self.bwd_block_m,
                            "dq_block_n": self.dq_block_n, "bwd_block_n": self.bwd_block_n}
        for name, step in transposed_steps.items():
            if DOC_ALIGN % step:  # a tile of one document must not reach another's transposed codes
                raise ValueError(f"{name}: must divide DOC_ALIGN = {DOC_ALIGN}, where documents of the transposed "
                                 f"codes start, got {step}")
        if self.dq_atomic and self.dq_block_n != self.bwd_block_n:
            raise ValueError(f"dq_atomic: the dQ payload's key step is the dK/dV key tile, so dq_block_n "
                             f"({self.dq_block_n}) must equal bwd_block_n ({self.bwd_block_n})")


@dataclass(frozen=True)
class QuantizerTiles:
    """The Q/K/V quantizer's program: ``operand_unit`` tokens of one head (a multiple of the
    32-token scale block; not numerics) with ``rotated_warps`` warps when the Hadamard
    rotation is on (Q and K), ``plain_warps`` otherwise (V). On the GPU the rotated launch is
    the Gluon kernel of ``rotated_quantizer.py`` (a token row per thread, so ``operand_unit``
    is a multiple of 32 x ``rotated_warps``); ``transposed_parts``: it writes its transposed
    codes in that many pieces of head-dim rows, before the row codes. The rotation's
    butterflies bound the Q and K launches, while V's runs near the copy bandwidth in every
    shape near this one, so the three share one program shape and one tile list. Chosen on one
    NVIDIA H200 with Triton 3.6, codes bitwise equal in every configuration;
    docs/PERFORMANCE.md has the figures."""

    operand_unit: int = 32
    rotated_warps: int = 1
    transposed_parts: int = 4
    plain_warps: int = 2
    # The Triton launches that form NVFP4 groups (quantize_fp4.py's packed NVFP4 operand) hold
    # a unit's rows in fp32 with their group scales, which spill at 2 warps and d=128
    # (docs/PERFORMANCE.md). On the GPU the Q, K and all-4-bit V launches that form them are
    # the Gluon one at rotated_warps.
    nvfp4_warps: int = 4

    def __post_init__(self):
        if self.transposed_parts not in (1, 2, 4):
            raise ValueError(f"transposed_parts: a piece of D / parts head-dim rows must fill the transposed store's "
                             f"16-row layout at D = 64, so parts is 1, 2 or 4, got {self.transposed_parts}")
        if self.operand_unit % (32 * self.rotated_warps) or not 32 <= self.operand_unit <= 512:
            raise ValueError(f"operand_unit: the rotated launch holds a token row per thread and stores 16 tokens "
                             f"per thread transposed, so it must be a multiple of 32 * rotated_warps "
                             f"({32 * self.rotated_warps}) in [32, 512], got {self.operand_unit}")


# d=64: half the head dim leaves registers free, so three 4-warp programs share an SM where
# d=128 fits two: 64-key forward tiles with 4 stages (164 registers) and the Gluon dK/dV
# capped at 168 registers; dQ with 2 stages. A cap changes no arithmetic; 64-key forward tiles
# move where the row max may rise, which the emulator follows (flamia/tiling.py).
# docs/PERFORMANCE.md has the figures.
TILES_D64 = AttnTiles(**asdict(numerics_tiles(64)), fwd_stages=4, dq_stages=2, dkdv_maxnreg=168)
TILES = {64: TILES_D64, 128: AttnTiles(**asdict(numerics_tiles(128)))}
# BF16 codes take twice E4M3's shared memory and register A operands: at d=128 their own numerics
# tiles (flamia/tiling.py) with E4M3's stages fit two programs per SM, bf16's 64-key dQ steps
# with 2 stages; at d=64 E4M3's tiles without its register cap (docs/PERFORMANCE.md).
BF16_TILES = {64: replace(TILES_D64, dkdv_maxnreg=None),
              128: AttnTiles(**asdict(numerics_tiles(128, "bf16")), dq_stages=2)}
# The all-4-bit route: bf16's kernels on fp4's numerics tiles (32-key dQ steps, 3 stages).
FP4_TILES = {64: BF16_TILES[64], 128: AttnTiles(**asdict(numerics_tiles(128, "fp4")))}
# The mixed NVFP4 route, whose BF16 score operands set its registers and shared memory too:
# bf16's tiles, with 128-key diagonal tiles at d=128 (flamia/tiling.py).
NVFP4_TILES = {64: BF16_TILES[64], 128: AttnTiles(**asdict(numerics_tiles(128, "nvfp4")), dq_stages=2)}
QUANTIZER = QuantizerTiles()
SUPPORTED_HEAD_DIMS = tuple(TILES)


def tiles_for(head_dim: int, route: Route = ROUTES["mxfp8"]) -> AttnTiles:
    """The tiles of the kernels at head_dim for a recipe's route (the all-4-bit route's BF16
    codes take BF16's: its changes are the kernels' flags; ``bf16_scores`` keeps its recipe's)."""
    if head_dim not in TILES:
        raise ValueError(f"head_dim: the kernels support {SUPPORTED_HEAD_DIMS}, got {head_dim}")
    return tile_table(route)[head_dim]


def tile_table(route: Route = ROUTES["mxfp8"]) -> dict[int, AttnTiles]:
    """The tiles by head dim for a recipe's route (``tiles_for``'s table, the one
    ``flamia.tiling.numerics_tiles`` names for the recipe; the benchmark scripts replace an
    entry to time or compile a candidate)."""
    if route.codes == BF16:
        return FP4_TILES if route.all4 else BF16_TILES
    return NVFP4_TILES if route.p4 else TILES
