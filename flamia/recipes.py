"""Named numerics recipes: frozen dataclasses validated once, at construction.

``Recipe`` holds every numerical choice of NUMERICS.md that a user or an ablation may flip.
The presets in ``RECIPES`` are what ``recipe="mxfp8"`` etc. resolve to.
"""
import ast
from dataclasses import dataclass, fields, replace

from .formats.e4m3 import LOG2_E4M3_MAX
from .formats.hadamard import HADAMARD_DIMS

RECIPE_NAMES = ("mxfp8", "nvfp4", "fp4", "bf16")
P4_RECIPE_NAMES = ("nvfp4", "fp4")  # the routes with 4-bit P
E4M3_P_RECIPE_NAMES = ("mxfp8",) + P4_RECIPE_NAMES  # the routes whose P multiplies V as E4M3 codes


@dataclass(frozen=True)
class Recipe:
    """One attention numerics configuration.

    name: "mxfp8" (token-block E4M3 everywhere), "nvfp4" (NVFP4 Q/K, 4-bit P off the diagonal,
        E4M3 elsewhere), "fp4" (all operands 4-bit), "bf16" (FlashAttention in BF16).
    tau: conditional-rescaling threshold of the integer running max (log2 units).
    sigma: power-of-two boost of P before E4M3 rounding. tau + sigma <= log2(448) is
        asserted unless ``check_saturation`` is False (only to reproduce the failure).
    hadamard: rotate Q and K by the normalized Hadamard matrix; None = the default (on at
        head dim 128 for mxfp8 and nvfp4, off otherwise).
    scale_block: tokens that share one operand exponent: 32 (default) or 1 (per-token
        scales, the exact options: no in-block residue).
    Ablation switches (each reproduces one of the paper's failure modes; emulator only, but
    fwd_approx_exp on mxfp8 and nvfp4, and nvfp4's p4_scale_before_mask, fwd_p4_bwd_p8 and
    fwd_diag_block_m, which the kernels run too):
    per_tensor_scales: one E4M3 scale per tensor for Q, K, V, dO (leaks across positions
        and documents; paper Table 5's per-tensor row).
    p4_scale_before_mask: 4-bit P group scales taken before the causal mask, so a group
        straddling the boundary sees future keys (the leaking 4-bit configuration).
    fwd_p4_bwd_p8: forward quantizes P to 4 bits, backward rebuilds it in E4M3.
    fwd_diag_block_m: forward treats query tiles of this many rows as diagonal tiles while
        the backward uses its own (nvfp4: diagonal tiles keep E4M3 P), e.g. 256 vs 128.
    fwd_approx_exp: forward uses Schraudolph's bit-level exponential, backward the exact one.
    bf16_scores: (mxfp8, nvfp4) S = Q K^T from BF16 codes of Q and K on the token blocks'
        exponents instead of their E4M3 codes (mxfp8) or NVFP4 values (nvfp4); P, V, dO, G and
        dQ's and dK's Q and K stay as the route has them. E4M3 and NVFP4 scores lose dQ and
        dK where attention is sharp (experiments/logit_scale.py); BF16 ones keep them.
    stochastic_grad: round G (dS) to E2M1 stochastically on the all-4-bit route, from
        counter-based random bits of the call's seed (NUMERICS.md 6); None = the default (on
        for fp4, the paper's all-4-bit route; the other routes' G is not 4-bit).
    Experiment (4-bit P routes; nvfp4's kernels run it too):
    p4_sum_quantized: the row sum l adds the 4-bit P values (before the V fold) instead of p
        on 4-bit tiles, so the weights O uses sum to one and the backward's dS sums to zero
        per row (experiments/README.md: plain nvfp4 diverged in the small profile, nvfp4
        with this option trained like BF16; fp4 diverged either way).
    p_sum_codes: the row sum l adds the values of the P codes that P.V uses, without the V
        fold (P^ / (vf rf)), on every tile, instead of p: O divides by the sum of the weights
        it used, so the backward's dS sums to zero per row (NUMERICS.md 3b). None = the
        default: on for the E4M3 P routes (mxfp8, nvfp4, fp4) unless p4_sum_quantized is set;
        False gives l from p, with which mxfp8 diverged at the paper's size.
    """

    name: str = "mxfp8"
    tau: int = 4
    sigma: int = 4
    hadamard: bool | None = None
    scale_block: int = 32
    check_saturation: bool = True
    per_tensor_scales: bool = False
    p4_scale_before_mask: bool = False
    fwd_p4_bwd_p8: bool = False
    fwd_diag_block_m: int | None = None
    fwd_approx_exp: bool = False
    p4_sum_quantized: bool = False
    p_sum_codes: bool | None = None
    stochastic_grad: bool | None = None
    bf16_scores: bool = False

    def __post_init__(self):
        if self.name not in RECIPE_NAMES:
            raise ValueError(f"recipe: name must be one of {RECIPE_NAMES}, got {self.name!r}")
        if not (isinstance(self.tau, int) and isinstance(self.sigma, int)) or self.tau < 0 or self.sigma < 0:
            raise ValueError(f"recipe: tau and sigma must be non-negative integers, got tau={self.tau!r}, sigma={self.sigma!r}")
        if self.check_saturation and self.tau + self.sigma > LOG2_E4M3_MAX:
            raise ValueError(
                f"recipe: tau + sigma = {self.tau + self.sigma} exceeds log2(448) = {LOG2_E4M3_MAX:.3f}: "
                "P entries up to 2^(tau+sigma) would saturate at 448 and corrupt O without a NaN")
        if self.scale_block not in (1, 32):
            raise ValueError(f"recipe: scale_block must be 32 (token blocks) or 1 (per-token), got {self.scale_block}")
        if self.fwd_diag_block_m is not None and (self.fwd_diag_block_m <= 0 or self.fwd_diag_block_m % 32):
            raise ValueError(f"recipe: fwd_diag_block_m must be a positive multiple of 32, got {self.fwd_diag_block_m}")
        if self.p4_sum_quantized and not self.has_p4:
            raise ValueError(f"recipe: p4_sum_quantized needs a 4-bit P route {P4_RECIPE_NAMES}, got {self.name!r}")
        if self.p_sum_codes and (self.name not in E4M3_P_RECIPE_NAMES or self.p4_sum_quantized):
            raise ValueError(f"recipe: p_sum_codes needs E4M3 P codes ('mxfp8', 'nvfp4' or 'fp4') and replaces "
                             f"p4_sum_quantized, got {self.name!r} with p4_sum_quantized={self.p4_sum_quantized}")
        if self.stochastic_grad and self.name != "fp4":
            raise ValueError(f"recipe: stochastic_grad needs the all-4-bit route 'fp4' (only its G is E2M1), "
                             f"got {self.name!r}")
        if self.bf16_scores and self.name not in ("mxfp8", "nvfp4"):
            raise ValueError(f"recipe: bf16_scores needs a route with E4M3 token blocks of Q and K, 'mxfp8' or "
                             f"'nvfp4' (fp4's scores are NVFP4 on no token blocks, bf16's already BF16), "
                             f"got {self.name!r}")
        # Not a field (equality and hashing ignore it): the recipe as a custom op's argument.
        object.__setattr__(self, "key", "|".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)))

    @staticmethod
    def from_key(key: str) -> "Recipe":
        """The recipe whose ``key`` is ``key``."""
        return Recipe(**{name: ast.literal_eval(value) for name, value in (item.split("=", 1)
                                                                            for item in key.split("|"))})

    @property
    def has_p4(self) -> bool:
        """Whether P is quantized to 4 bits on some tiles (nvfp4, fp4)."""
        return self.name in P4_RECIPE_NAMES

    @property
    def rounds_grad_stochastically(self) -> bool:
        """Whether G is rounded stochastically (``stochastic_grad``, None: on for fp4)."""
        return self.name == "fp4" if self.stochastic_grad is None else self.stochastic_grad

    @property
    def sums_codes(self) -> bool:
        """Whether l adds the P codes' values (``p_sum_codes``; None: on for the E4M3 P routes
        unless ``p4_sum_quantized`` is set)."""
        if self.p_sum_codes is None:
            return self.name in E4M3_P_RECIPE_NAMES and not self.p4_sum_quantized
        return self.p_sum_codes

    @property
    def exact(self) -> bool:
        """Per-token operand scales: earlier outputs cannot change when a later token does."""
        return self.scale_block == 1

    @property
    def is_ablation(self) -> bool:
        return (self.per_tensor_scales or self.p4_scale_before_mask or self.fwd_p4_bwd_p8
                or self.fwd_diag_block_m is not None or self.fwd_approx_exp or not self.check_saturation)

    def use_hadamard(self, head_dim: int) -> bool:
        if self.hadamard is None:
            return self.name in ("mxfp8", "nvfp4") and head_dim == 128
        if self.hadamard and head_dim not in HADAMARD_DIMS:
            raise ValueError(f"recipe: hadamard needs head_dim in {HADAMARD_DIMS}, got {head_dim}")
        return self.hadamard

    def with_(self, **changes) -> "Recipe":
        return replace(self, **changes)


RECIPES = {
    "mxfp8": Recipe("mxfp8"),
    "mxfp8-exact": Recipe("mxfp8", scale_block=1),
    "nvfp4": Recipe("nvfp4"),
    "nvfp4-exact": Recipe("nvfp4", scale_block=1),
    "fp4": Recipe("fp4"),
    "bf16": Recipe("bf16"),
}


def resolve_recipe(recipe: "str | Recipe") -> Recipe:
    """A preset name or a Recipe -> Recipe (TypeError/ValueError naming ``recipe`` otherwise)."""
    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, str):
        if recipe not in RECIPES:
            raise ValueError(f"recipe: unknown recipe {recipe!r}; choose one of {sorted(RECIPES)}")
        return RECIPES[recipe]
    raise TypeError(f"recipe: expected a name or flamia.Recipe, got {type(recipe).__name__}")
