"""Triton helpers of the 4-bit formats (NUMERICS.md 1 and 6): E2M1 codes, the E4M3 grid
rounded up, two codes per byte. Each is exact in fp32 arithmetic on the values' bits (exact
powers of two, the 1.5 * 2^23 round-to-integer), so it runs the same on the GPU and under
the interpreter and equals ``flamia.formats`` (``e2m1_codes``, ``nvfp4.e4m3_round_up``,
``pack_e2m1``) bit for bit.
"""
import triton
import triton.language as tl

from .fp8 import pow2

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
    """fp32 x in [0, 6] -> fp32 on the E2M1 grid, nearest, ties to even
    (``formats.e2m1.round_to_e2m1``). From 1 up the grid is every value with one mantissa
    bit: round the bits there (add half a step less one, plus the kept bit, then truncate);
    below 1 it is multiples of 0.5: the 1.5 * 2^22 add rounds there. Seven operations, the
    4-bit P's cost per score."""
    b = x.to(tl.int32, bitcast=True)
    r1 = ((b + 0x1FFFFF + ((b >> 22) & 1)) & -0x400000).to(tl.float32, bitcast=True)
    return tl.where(x < 1.0, (x + _HALF_STEPS) - _HALF_STEPS, r1)


@triton.jit
def pack_e2m1(codes):
    """codes [R, N] (int, 0..15, N even) -> uint8 [R, N / 2], element 2i in the low nibble of
    byte i and 2i + 1 in the high one (``formats.e2m1.pack_e2m1``; CUTLASS's NVFP4 order)."""
    R: tl.constexpr = codes.shape[0]
    N: tl.constexpr = codes.shape[1]
    even, odd = tl.split(tl.reshape(codes, [R, N // 2, 2]))  # [R, N / 2] each
    return (even | (odd << 4)).to(tl.uint8)
