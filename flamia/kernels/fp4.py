"""Triton helpers of the 4-bit formats (NUMERICS.md 1 and 6): E2M1 codes, the E4M3 grid
rounded up, two codes per byte, NVFP4's group scales and the mixed route's score codes. Each
is exact in fp32 arithmetic on the values' bits (exact powers of two, the 1.5 * 2^23
round-to-integer), so it runs the same on the GPU and under the interpreter and equals
``flamia.formats`` (``e2m1_codes``, ``nvfp4.e4m3_round_up``, ``pack_e2m1``) bit for bit.
"""
import triton
import triton.language as tl

from ..formats.e2m1 import E2M1_MAX
from ..formats.nvfp4 import NVFP4_G_SHIFT, NVFP4_GROUP
from ..formats.random_bits import ROUND_BITS, ROUND_MASK
from ..reference.operands_fp4 import TOKEN_GROUP
from .fp8 import E4M3_EQ, E4M3_MQ, abs_max, pow2, scale_exponent

GROUP = tl.constexpr(NVFP4_GROUP)  # NVFP4 elements per scale, as a kernel constant
E2M1_EQ = tl.constexpr(2)  # 6 = (1 + 0x400000 / 2^23) * 2^2: scale_exponent's qmax for E2M1
E2M1_MQ = tl.constexpr(0x400000)
TOKENS = tl.constexpr(TOKEN_GROUP)  # tokens of one document per scale along a token contraction (G too)
_ROUND_MASK = tl.constexpr(ROUND_MASK)  # the bits a stochastic rounding adds to (below the kept one)
_ROUND_KEEP = tl.constexpr(-(ROUND_MASK + 1))  # the kept bits: sign, exponent, one mantissa bit
_ROUND_SHIFT = tl.constexpr(32 - ROUND_BITS)
_SPACING_ADD = tl.constexpr((22 << 23) | 0x400000)  # 1.5 * 2^(k + 22) from 2^k's bits: rounds to 2^(k - 1)
_E2M1_MAX = tl.constexpr(E2M1_MAX)
G_SHIFT = tl.constexpr(NVFP4_G_SHIFT)

# fp32 x + 1.5 * 2^23 - 1.5 * 2^23 rounds |x| < 2^22 to an integer, ties to even.
_ROUND = tl.constexpr(12582912.0)
_HALF_STEPS = tl.constexpr(6291456.0)  # 1.5 * 2^22: fp32 adds near it round to multiples of 0.5


@triton.jit
def round_int(y):
    """y (fp32, |y| < 2^22) rounded to an integer, half to even (fp32 adds round so)."""
    return (y + _ROUND) - _ROUND


@triton.jit
def e4m3_step_exp(x):
    """int32 k with 2^k the E4M3 grid spacing at fp32 x >= 0 (``formats.e4m3.e4m3_ulp``):
    floor(log2 x) - 3, at least -9 (the subnormal spacing); 0 gets -4 as torch.frexp(0)'s
    exponent 0 gives it there (the one place it shows: a zero scale stepped up becomes 2^-4)."""
    e = ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    return tl.where(x == 0, -1, tl.maximum(e, -6)) - 3


@triton.jit
def e4m3_round_up(x):
    """The smallest E4M3 value >= x, fp32, for 0 <= x <= 448 (``formats.nvfp4.e4m3_round_up``):
    scale so the grid step is 1 (exact: x < 16 steps), take the ceiling, scale back."""
    k = e4m3_step_exp(x)
    y = x * pow2(-k)
    q = round_int(y)
    q = tl.where(q < y, q + 1.0, q)  # nearest below y: one up makes the ceiling
    return q * pow2(k)


@triton.jit
def e2m1_codes(x):
    """int32 E2M1 codes (0..15, bit 3 the sign of x < 0) of fp32 x, nearest, ties to the even
    code (``formats.e2m1.e2m1_codes``); |x| > 6 and NaN take magnitude code 7. Magnitudes
    below 2, 4 and 6 sit 0.5, 1 and 2 apart: a / spacing rounds to an integer q, and the
    magnitude's code is q, q + 2 or q + 4 (0.5 q for q < 4; 2, 3, 4 at 4, 5, 6; 4, 6 at 6, 7)."""
    a = tl.abs(x)
    a = tl.where(a < 6.0, a, 6.0)  # saturate, and send NaN to 6 before the int conversion
    wide = (a >= 2.0).to(tl.int32) + (a >= 4.0).to(tl.int32)  # spacing 2^(wide - 1)
    q = round_int(a * pow2(1 - wide))  # exact scaling, then one rounding
    return (q.to(tl.int32) + 2 * wide) | ((x < 0).to(tl.int32) << 3)


@triton.jit
def round_e2m1(x):
    """fp32 x in [0, 6] or NaN -> fp32 on the E2M1 grid, nearest, ties to even
    (``formats.e2m1.round_to_e2m1``), NaN kept. From 1 up the grid is every value with one
    mantissa bit: round the bits there (add half a step less one, plus the kept bit, then
    truncate); below 1 it is multiples of 0.5: the 1.5 * 2^22 add rounds there. A NaN takes
    the add (x >= 1 is false), since the bits would carry the GPU's NaN, 0x7FFFFFFF, into the
    sign and give -0. Seven operations, the 4-bit P's cost per score."""
    b = x.to(tl.int32, bitcast=True)
    r1 = ((b + 0x1FFFFF + ((b >> 22) & 1)) & -0x400000).to(tl.float32, bitcast=True)
    return tl.where(x >= 1.0, r1, (x + _HALF_STEPS) - _HALF_STEPS)


@triton.jit
def _with_sign(mag, y, sign):
    """mag (fp32 >= 0) with the sign bit ``sign`` (int32, 0 or -2^31; a negation may compile to
    0 - x, which drops the sign of a zero), and y itself where y is NaN."""
    return tl.where(y == y, (mag.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True), y)


@triton.jit
def round_e2m1_signed(y):
    """fp32 y, |y| <= 6 or NaN -> fp32 on the E2M1 grid, nearest, ties to even, y's sign bit
    kept as torch.round keeps it (-0 stays -0, a negative value that rounds to zero is -0) and
    a NaN kept as it is."""
    return _with_sign(round_e2m1(tl.abs(y)), y, y.to(tl.int32, bitcast=True) & -0x80000000)


@triton.jit
def round_e2m1_at(x, e):
    """``e2m1(x 2^-e) 2^e``, nearest, ties to even (``round_e2m1`` under a power-of-two scale)
    of fp32 x in [0, 6 2^e] or NaN, int32 e in [-126, 127] broadcast to x, rounded at x's own
    scale: the E2M1 spacing at scaled magnitudes in [2^k, 2^(k+1)) is 2^(k-1), and 0.5 below
    1, so at x's scale it is 2^(max(floor(log2 x), e) - 1), and adding and subtracting
    c = 1.5 * 2^23 times the spacing rounds to it. c's bits are the larger exponent field
    plus a constant: four operations per value, against nine to scale by 2^-e, round
    (``round_e2m1``) and scale back. A NaN's exponent field wraps the sum negative, so it
    takes e's c and stays NaN. An e above 105 counts as 105 (c's exponent field would pass
    254): exact for x < 2^103, which rounds to 0 under either (4-bit P is at most 2^tau, while
    the leaking ablation's group maxima over masked keys reach any e)."""
    b = x.to(tl.int32, bitcast=True)
    e = tl.minimum(e, 105)
    c = tl.maximum((b & 0x7F800000) + _SPACING_ADD, ((e + 127) << 23) + _SPACING_ADD)
    c = c.to(tl.float32, bitcast=True)
    return (x + c) - c


@triton.jit
def round_e2m1_stochastic_at(y, pe, word):
    """fp32 y under the power-of-two scale pe = 2^e (broadcast to y; |y| <= 6 pe or NaN) ->
    ``sign(y) e2m1_sr(|y| / pe) pe``, the stochastic rounding of ``formats.e2m1``'s
    ``round_to_e2m1_stochastic`` with the uint32 random words ``word``, at y's own scale: the
    magnitude's 22 bits below the kept one plus ``round_bits(word)``, truncated; magnitudes
    below pe (scaled below 1, whose kept bit is the spacing's 0.5) through their sum with pe.
    Powers of two scale exactly, so the bits are the scaled rounding's times pe."""
    a = tl.minimum(tl.abs(y), 6.0 * pe)  # a NaN may become 6 pe here; _with_sign puts it back
    off = tl.where(a < pe, pe, 0.0)
    z = (a + off).to(tl.int32, bitcast=True) + (_ROUND_MASK - (word >> _ROUND_SHIFT).to(tl.int32))
    mag = (z & _ROUND_KEEP).to(tl.float32, bitcast=True) - off
    # the reference's sign is where(y < 0, -mag, mag): -0 gives +0
    return _with_sign(mag, y, (y < 0).to(tl.int32) << 31)


@triton.jit
def e2m1_pow2(x, amax):
    """E2M1 under a power-of-two scale (``formats.nvfp4.round_e2m1_pow2``): fp32
    ``e2m1(x 2^-e) 2^e`` with ``e = scale_exponent(amax, 6)``; amax broadcasts to x and is at
    least its group's max |x|, so nothing clamps."""
    e = scale_exponent(amax, E2M1_EQ, E2M1_MQ)
    return round_e2m1_signed(x * pow2(-e)) * pow2(e)


@triton.jit
def e2m1_grad(b_g, b_word, STOCHASTIC: tl.constexpr):
    """The all-4-bit route's G (NUMERICS.md 6): b_g [R, C] fp32 -> fp32 E2M1 values times
    their power-of-two scales, one scale per (row, 16 columns from the tile's start),
    e = scale_exponent(group max |G|, 6); rounded stochastically with the random words b_word
    [R, C] uint32 when STOCHASTIC, else to nearest. The scale is folded into the values, as
    exact as the values themselves (two significant bits), so a BF16 MMA takes them as they
    are."""
    R: tl.constexpr = b_g.shape[0]
    C: tl.constexpr = b_g.shape[1]
    b_x = tl.reshape(b_g, [R, C // TOKENS, TOKENS])
    e = tl.expand_dims(scale_exponent(tl.max(tl.abs(b_x), axis=2), E2M1_EQ, E2M1_MQ), 2)  # [R, C / 16, 1]
    if STOCHASTIC:
        b_r = round_e2m1_stochastic_at(b_x, pow2(e), tl.reshape(b_word, [R, C // TOKENS, TOKENS]))
    else:
        b_r = round_e2m1_signed(b_x * pow2(-e)) * pow2(e)
    return tl.reshape(b_r, [R, C])


@triton.jit
def pack_e2m1(codes):
    """codes [R, N] (int, 0..15, N even) -> uint8 [R, N / 2], element 2i in the low nibble of
    byte i and 2i + 1 in the high one (``formats.e2m1.pack_e2m1``; CUTLASS's NVFP4 order)."""
    R: tl.constexpr = codes.shape[0]
    N: tl.constexpr = codes.shape[1]
    even, odd = tl.split(tl.reshape(codes, [R, N // 2, 2]))  # [R, N / 2] each
    return (even | (odd << 4)).to(tl.uint8)


@triton.jit
def _group_scales(b_amax16, b_g):
    """E4M3 scales [U, G] fp32 of the groups whose max |x| is b_amax16 [U, G], rows of scale
    b_g [U, 1] (a power of two, at least the row max / 1792, so the ratio stays below 448):
    the ratio to 6 g rounded up on the grid, one grid step up where the group's maximum would
    still scale above 6 (``past_e2m1_max``)."""
    # tensor * constant: the other order fails in Triton 3.8's interpreter (fp8.py's list)
    b_s = e4m3_round_up(tl.math.div_rn(b_amax16, b_g * _E2M1_MAX))
    return tl.where(past_e2m1_max(b_amax16, b_s * b_g), b_s + pow2(e4m3_step_exp(b_s)), b_s)


@triton.jit
def past_e2m1_max(a, p):
    """Whether the fp32 quotient a / p rounds above 6, for fp32 a >= 0 (or NaN) and p = s g,
    an E4M3 scale times g >= 2^-126, without the division (about ten instructions and an
    out-of-line slow path per group): a > 6 p. p and 6 p are exact (multiples of 2^-135 with
    at most 6 significant bits), a <= 6 p gives a quotient of at most 6, and the next
    fp32 above 6 p lies more than 6 p 2^-24 above it, so its quotient passes 6 + 2^-22, the
    midpoint above 6. a / 0 > 6 for every a > 0, as the division's infinity is; NaN is false."""
    return a > p * _E2M1_MAX


@triton.jit
def scaled_quotient(x, s, g):
    """(q, e): x / (s * g) times 2^e, rounded once, for an E4M3 scale s > 0 and a power of two
    g = 2^eg >= 2^-126 with |x| <= 1792 g (x in a block whose exponent gives g), without a
    division per element: the quotient a / s of a = x * 2^f (f = min(64 - eg, 127), exact)
    through s's reciprocal and one correction, r = a - q s exact in an fma and q + r / s
    rounded once (Markstein; tests/test_kernel_fp4_divide.py checks every significand against
    every scale); e = f + eg (int32, at most 64). Why a = x * 2^f: a quotient a / s that loses
    bits below 2^-126 belongs to an x / (s g) below 2^-181, and 2^f keeps a normal where |x|
    is; a division per element costs about ten instructions and an out-of-line slow path,
    which spills the one-row-per-thread Q/K launch."""
    eg = ((g.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    f = tl.minimum(64 - eg, 127)
    a = x * pow2(f)
    y = tl.math.div_rn(1.0, s)  # one per scale
    q = a * y
    return tl.fma(tl.fma(-q, s, a), y, q), f + eg


@triton.jit
def divide_by_scale(x, s, g):
    """x / (s * g) in fp32 (``scaled_quotient`` scaled back by 2^-e): equal to
    ``tl.math.div_rn(x, s * g)`` wherever that is a nonzero normal fp32 number; below 2^-126
    equal to it in being zero or not, and in sign where not, all that E2M1 rounding reads (a
    zero may come as +0 where div_rn gives -0)."""
    q, e = scaled_quotient(x, s, g)
    return q * pow2(-e)


@triton.jit
def group_ratios(b_groups, b_g):
    """NVFP4 of rows split into their 16-element groups, b_groups [U, D / 16, 16] fp32, with
    per-row g = 2^(e - 2) b_g [U, 1, 1] fp32 (``formats.nvfp4``): (E4M3 group scales
    [U, D / 16, 1] fp32, x / (s * g) [U, D / 16, 16] fp32, 0 in a group whose s * g is 0). A
    non-finite x gives its row NaN scales. Every row's values enter through its own groups and
    g alone, so the caller picks the layout (a Gluon kernel: a row's groups in one thread)."""
    b_amax16 = tl.max(tl.abs(b_groups), axis=2, keep_dims=True)  # [U, D / 16, 1]
    # x * 0 is 0, or NaN for a non-finite x (tl.max drops NaNs on the GPU): NaN scales carry it
    b_nan = tl.sum(tl.sum(b_groups * 0.0, axis=2, keep_dims=True), axis=1, keep_dims=True)  # [U, 1, 1]
    b_s = _group_scales(b_amax16, b_g) + b_nan
    return b_s, tl.where(b_s * b_g > 0, divide_by_scale(b_groups, b_s, b_g), 0.0)


@triton.jit
def nvfp4_groups(b_x, b_e, D: tl.constexpr):
    """NVFP4 along the head dim of rows b_x [U, D] fp32 with per-token exponents b_e [U] int32
    (``group_ratios``): (E4M3 group scales [U, D / 16] fp32, x / (s * g) [U, D] fp32)."""
    U: tl.constexpr = b_x.shape[0]
    b_s, b_scaled = group_ratios(tl.reshape(b_x, [U, D // GROUP, GROUP]), pow2(b_e - G_SHIFT)[:, None, None])
    return tl.reshape(b_s, [U, D // GROUP]), tl.reshape(b_scaled, [U, D])


@triton.jit
def group_score_codes(b_groups, b_g):
    """The mixed NVFP4 route's score codes of b_groups [U, D / 16, 16] fp32 with per-row g
    b_g [U, 1, 1] (``group_ratios``): E2M1 value x E4M3 scale x 2^-2 [U, D / 16, 16] fp32,
    exact in bf16. A negative value that rounds to zero keeps its sign, as the decoded sign
    bit does. The ratio is rounded to E2M1 at its 2^e scale (``scaled_quotient``,
    ``round_e2m1_at``) and the 2^-e goes into the scale's factor: the same values in fewer
    operations than scaling back, rounding and selecting (docs/PERFORMANCE.md)."""
    b_amax16 = tl.max(tl.abs(b_groups), axis=2, keep_dims=True)  # [U, D / 16, 1]
    # x * 0 is 0, or NaN for a non-finite x (tl.max drops NaNs on the GPU): NaN scales carry it
    b_nan = tl.sum(tl.sum(b_groups * 0.0, axis=2, keep_dims=True), axis=1, keep_dims=True)  # [U, 1, 1]
    b_s = _group_scales(b_amax16, b_g) + b_nan
    b_q, b_e = scaled_quotient(b_groups, b_s, b_g)
    # The sign of a value whose fp32 ratio x / (s g) is a nonzero negative number, as the
    # reference's codes take it: q 2^-e rounds to zero unless |q| > 2^(e - 150) (a subnormal
    # power of two where e < 24). As a bit: a negation may compile to 0 - x, which drops the
    # sign of a zero.
    b_tiny = tl.where(b_e >= 24, pow2(tl.maximum(b_e, 24) - 150),
                      (1 << (tl.maximum(b_e, 1) - 1)).to(tl.float32, bitcast=True))
    sign = (b_q < -b_tiny).to(tl.int32) << 31
    b_r = (round_e2m1_at(tl.abs(b_q), b_e).to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    # an all-zero group's scale is 0 and its quotients 0 / 0: its codes are 0 (a NaN scale's NaN)
    return tl.where(b_s > 0, b_r * (b_s * pow2(-2 - b_e)), b_s * 0.0)


@triton.jit
def score_codes(b_x, b_e, D: tl.constexpr):
    """``group_score_codes`` of rows b_x [U, D] fp32 whose per-token exponents b_e [U] int32
    are the MXFP8 operand's (``reference.operands_fp4.nvfp4_operand``): [U, D] fp32."""
    U: tl.constexpr = b_x.shape[0]
    b_v = group_score_codes(tl.reshape(b_x, [U, D // GROUP, GROUP]), pow2(b_e - G_SHIFT)[:, None, None])
    return tl.reshape(b_v, [U, D])


@triton.jit
def nvfp4_values(b_x, b_amax, D: tl.constexpr):
    """The all-4-bit route's head-dim operand: rows b_x [U, D] fp32 (max |x| b_amax [U]) in
    NVFP4, decoded: E2M1 value x E4M3 scale x g [U, D] fp32, each token its own g = 2^(e - 2),
    e = scale_exponent(amax, 448) (``reference.operands_fp4.nvfp4_operand(x).dequantize()``:
    every product exact, so their order is free). A non-finite x makes its row NaN."""
    b_e = scale_exponent(b_amax, E4M3_EQ, E4M3_MQ)  # [U]
    return score_codes(b_x, b_e, D) * pow2(b_e)[:, None]


@triton.jit
def token_group_values(b_t):
    """The all-4-bit route's token-axis operand: b_t [D, U] fp32 (tokens along axis 1, every 16
    of one document) in E2M1 with one power-of-two scale per (16 tokens, head-dim row), decoded
    [D, U] fp32 (``reference.operands_fp4.token_axis_values``). A NaN makes its group's other
    values 0, as there."""
    D: tl.constexpr = b_t.shape[0]
    U: tl.constexpr = b_t.shape[1]
    b_g = tl.reshape(b_t, [D, U // TOKENS, TOKENS])
    return tl.reshape(e2m1_pow2(b_g, abs_max(b_g, 2)[:, :, None]), [D, U])
