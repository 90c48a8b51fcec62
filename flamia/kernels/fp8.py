"""Triton helpers shared by the kernels: exact powers of two, scale exponents, E4M3 and BF16
rounding (``CODES``, the operand format of configs.OperandFormat), FP8 and BF16 matrix
products, loads masked only where a tile may leave its document. The Triton interpreter's
known bugs are worked around here and only here (``INTERPRET`` is a constexpr
the launchers pass):
- its fp32 -> fp8 ``.to()`` mis-rounds about 2% of values, so values are first rounded to the
  E4M3 grid in fp32 (bit-exact round-to-nearest-even), which makes the cast exact;
- its ``tl.dot`` on low-precision operands is unreliable, so operands are upcast to fp32;
- its fp32 -> bf16 cast truncates and gets subnormals wrong, so ``to_output`` rounds on the
  bits and takes their upper half as the bf16's;
- its bf16 -> fp32 cast renormalizes bf16 subnormals into wrong fp32 values (both formats
  share the exponent range), so ``to_fp32`` moves the bits up 16 places instead;
- it cannot run inline PTX, so ``e4m3_grid`` rounds there in fp32 arithmetic instead, and
  ``mul_rn`` multiplies plainly (numpy rounds each product on its own anyway);
- its ``tl.fma`` rounds the product and then the sum (numpy's ``x * y + z``), where the GPU's
  rounds once; ``fma_f32`` rounds once, and ``_patch_exact_fma`` makes the interpreter use it
  (``fp4.divide_by_scale`` depends on it);
- before Triton 3.7 it turns a runtime loop bound into an int with ``int()`` of a one-element
  array, which numpy 2.4 refuses (triton-lang/triton#9171): ``_patch_scalar_index``;
- Triton 3.8's interpreter keeps a global constexpr times a tensor a constexpr, which
  ``tl.math`` refuses (``SIX = tl.constexpr(6.0)``, then ``tl.math.div_rn(x, SIX * x)`` in a
  kernel raises "cannot convert ... to tensor"; Triton 3.6 runs it), so a constant multiplies
  from the right.
"""
import functools
import os

import numpy as np
import triton
import triton.language as tl

EXP_MIN = tl.constexpr(-100)
EXP_MAX = tl.constexpr(127)
# qmax = Mq * 2^Eq as (Eq, mantissa bits of Mq): 448 = 1.75 * 2^8, 6 = 1.5 * 2^2.
E4M3_EQ = tl.constexpr(8)
E4M3_MQ = tl.constexpr(0x600000)


@functools.cache
def interpreting() -> bool:
    """True when Triton kernels run on the CPU interpreter (TRITON_INTERPRET=1). Read once:
    Triton decides when it decorates the kernels, at import, and reading the environment
    costs microseconds in every launcher."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _patch_scalar_index() -> None:
    """Give the interpreter's scalar tensors an ``__index__`` that reads their one element
    (Triton < 3.7, whose own conversion numpy 2.4 refuses)."""
    from triton.runtime import interpreter

    patch_tensor = interpreter._patch_lang_tensor

    def patch(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    interpreter._patch_lang_tensor = patch


def fma_f32(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """x * y + z of float32 arrays rounded once to float32, as the GPU's fma. In float64 the
    product is exact (24 + 24 bits) and TwoSum gives the sum's rounding error exactly; the
    float32 rounding of the float64 sum is then the fma's except where that sum lies exactly
    halfway between two float32 neighbours, where the error's sign picks the side."""
    x64, y64, z64 = (np.asarray(v, dtype=np.float64) for v in (x, y, z))
    with np.errstate(over="ignore", invalid="ignore"):  # inf * 0, inf - inf and overflow give what fma gives
        p = x64 * y64
        s = p + z64
        b = s - p
        err = (p - (s - b)) + (z64 - b)  # s + err == p + z exactly
        r = s.astype(np.float32)
        r64 = r.astype(np.float64)
        other = np.nextafter(r, np.where(s > r64, np.float32(np.inf), np.float32(-np.inf)))  # the neighbour on s's side
        half = (other.astype(np.float64) - r64) / 2
        beyond = (s - r64 == half) & (err * half > 0)  # a tie in float64 that the exact sum passes
    return np.where(beyond, other, r)


def _patch_exact_fma() -> None:
    """Make the interpreter's float32 ``tl.fma`` round once (``fma_f32``)."""
    from triton.runtime import interpreter

    create_fma = interpreter.InterpreterBuilder.create_fma

    def fma(self, x, y, z):
        if z.data.dtype != np.float32:
            return create_fma(self, x, y, z)
        return interpreter.TensorHandle(fma_f32(x.data, y.data, z.data), z.dtype.scalar)

    interpreter.InterpreterBuilder.create_fma = fma


if interpreting():
    _patch_exact_fma()
    if tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 7):
        _patch_scalar_index()


@triton.jit
def pow2(e):
    """Exact fp32 2^e of an int32 tensor, e in [-126, 127]."""
    return ((e + 127) << 23).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def pow2_reciprocal(x):
    """Exact 1 / x of an fp32 power of two x = 2^e, e in [-126, 126], from its bits: the
    exponent field E becomes 254 - E (one integer subtract instead of a division). The
    factors the kernels invert stay inside: a block exponent (eQ, eV, PV) of finite values
    lies in [EXP_MIN, 120], and rf = 2^(sigma - PV)."""
    return (0x7F000000 - x.to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)


@triton.jit
def scale_exponent(amax, EQ: tl.constexpr, MQ: tl.constexpr):
    """Smallest e with amax * 2^-e <= qmax (qmax = (1 + MQ/2^23) * 2^EQ), clamped to
    [EXP_MIN, EXP_MAX]; int32. Integer arithmetic on amax's bits, as flamia.formats.scales."""
    bits = amax.to(tl.int32, bitcast=True)
    e_amax = ((bits >> 23) & 0xFF) - 127
    e = e_amax - EQ + ((bits & 0x7FFFFF) > MQ).to(tl.int32)
    e = tl.where(e_amax == -127, EXP_MIN, e)
    return tl.minimum(tl.maximum(e, EXP_MIN), EXP_MAX)


@triton.jit
def abs_max(b_x, axis: tl.constexpr):
    """max |b_x| (fp32) along axis, NaN where a NaN is among them, as torch's amax (tl.max of
    floats drops NaNs, on the GPU and the interpreter alike): the max of the magnitudes' bits,
    whose integer order is the floats' with NaNs above +inf. One IMNMX per step, as FMNMX."""
    return tl.max(b_x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=axis).to(tl.float32, bitcast=True)


@triton.jit
def block_exponents(b_x, BLOCK: tl.constexpr):
    """[U] int32 E4M3 scale exponents of b_x [U, D] fp32, one per BLOCK consecutive rows
    repeated per row (rows past a document's end must hold zeros): the quantizers scale by
    ``pow2(-e)`` and round (``to_e4m3``) in each layout they store."""
    U: tl.constexpr = b_x.shape[0]
    b_amax = tl.reshape(tl.max(tl.abs(b_x), axis=1), [U // BLOCK, BLOCK])
    b_amax = tl.broadcast_to(tl.max(b_amax, axis=1, keep_dims=True), [U // BLOCK, BLOCK])
    return scale_exponent(tl.reshape(b_amax, [U]), E4M3_EQ, E4M3_MQ)  # [U]


@triton.jit
def round_e4m3(x):
    """fp32 -> fp32 on the E4M3 grid, round to nearest even, in plain fp32 arithmetic: scale
    by an exact power of two so the grid step is 1, round with the 1.5 * 2^23 trick (fp32 adds
    round ties to even), scale back. Keeps the sign of values that round to zero."""
    bits = x.to(tl.int32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)
    y = x * pow2(3 - e)
    y = (y + 12582912.0) - 12582912.0
    return tl.where(y == 0, x * 0.0, y * pow2(e - 3))


@triton.jit
def e4m3_grid(x, INTERPRET: tl.constexpr):
    """fp32 -> fp32 on the E4M3 grid, round to nearest even, saturating at 448 (callers'
    scales keep |x| <= 448, where it equals ``round_e4m3``). On the GPU a round trip through
    the hardware conversions, 2.5 instructions per value against about 15 integer and fp32
    operations for ``round_e4m3``: the backward rounds every P code this way, and its
    kernels are bound by instruction issue. Returning fp32, not fp8, keeps an fp8 tensor that also feeds a wgmma
    from being converted back (the Triton 3.6 miscompile in attn_bwd.py)."""
    if INTERPRET:
        return round_e4m3(x)
    return tl.inline_asm_elementwise(
        """{
        .reg .b16 c, lo, hi;
        .reg .b32 h;
        cvt.rn.satfinite.e4m3x2.f32 c, $3, $2;
        cvt.rn.f16x2.e4m3x2 h, c;
        mov.b32 {lo, hi}, h;
        cvt.f32.f16 $0, lo;
        cvt.f32.f16 $1, hi;
        }""",
        "=r,=r,r,r", [x], dtype=tl.float32, is_pure=True, pack=2)


@triton.jit
def e4m3_with_f16(x):
    """fp32 -> (float8e4nv codes, float16 of the codes' values), round to nearest even,
    saturating at 448 (as ``to_e4m3`` on the GPU): one conversion to E4M3 pairs, then one
    widening to f16 pairs, exact (E4M3 lies inside f16), the operand of an MMA over the codes'
    values. Made from x, not from the fp8 tensor: converting an fp8 tensor that feeds a wgmma
    is what Triton 3.6 miscompiles (``e4m3_grid``). GPU only."""
    return tl.inline_asm_elementwise(
        """{
        .reg .b16 lo, hi;
        cvt.rn.satfinite.e4m3x2.f32 lo, $4, $3;
        cvt.rn.satfinite.e4m3x2.f32 hi, $6, $5;
        mov.b32 $0, {lo, hi};
        cvt.rn.f16x2.e4m3x2 $1, lo;
        cvt.rn.f16x2.e4m3x2 $2, hi;
        }""",
        "=r,=r,=r,r,r,r,r", [x], dtype=(tl.float8e4nv, tl.float16), is_pure=True, pack=4)


@triton.jit
def bf16_grid(x, INTERPRET: tl.constexpr):
    """fp32 -> fp32 on the BF16 grid, round to nearest even (``round_bf16``'s values; a NaN
    stays a NaN). On the GPU a round trip through the hardware conversions, about 1.5
    instructions per value against 6 on the bits, in one asm block, so no bf16 tensor that
    could also feed a wgmma is ever converted back (``e4m3_grid``)."""
    if INTERPRET:
        return round_bf16(x)
    return tl.inline_asm_elementwise(
        """{
        .reg .b16 lo, hi;
        .reg .b32 h;
        cvt.rn.bf16x2.f32 h, $3, $2;
        mov.b32 {lo, hi}, h;
        cvt.f32.bf16 $0, lo;
        cvt.f32.bf16 $1, hi;
        }""",
        "=r,=r,r,r", [x], dtype=tl.float32, is_pure=True, pack=2)


@triton.jit
def mul_rn(x, y, INTERPRET: tl.constexpr):
    """x * y in fp32, rounded on its own (broadcast like ``*``). ptxas contracts a product and
    an add that uses it into one fma, which rounds once, and which product of a pair stays
    unrounded follows the register layout: before the Hadamard rotate-back both the Triton
    dK/dV epilogue and the Gluon one (attn_dkdv_gluon.py, a row per thread) had their
    scale products contracted into the first butterfly, and their fp32 dK differed in about
    half the values. ``mul.rn`` is never contracted: every kernel rounds
    the product as the emulator does."""
    if INTERPRET:
        return x * y
    return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [x, y], dtype=tl.float32,
                                     is_pure=True, pack=1)


@triton.jit
def to_e4m3(x, INTERPRET: tl.constexpr):
    """fp32 -> float8e4nv, round to nearest even (no saturation expected: callers' scales
    keep |x| <= 448). NaN gives the NaN code, as the GPU's conversion does (the interpreter's
    would give 384)."""
    if INTERPRET:
        nan = tl.full(x.shape, 0x7F, tl.uint8).to(tl.float8e4nv, bitcast=True)
        return tl.where(x != x, nan, round_e4m3(x).to(tl.float8e4nv))
    return x.to(tl.float8e4nv)


@triton.jit
def to_fp32(x, INTERPRET: tl.constexpr):
    """bf16, fp16 or fp32 -> fp32, exact for every value (bf16 subnormals too: on the
    interpreter a bf16 is its fp32's upper 16 bits)."""
    if INTERPRET:
        if x.dtype == tl.bfloat16:
            x = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return x.to(tl.float32)


@triton.jit
def inf_to_nan(x):
    """x with +-inf replaced by NaN, for the quantizers' scaled inputs: the GPU's fp32 -> E4M3
    conversion saturates inf to 448, which would turn a non-finite input into a finite one;
    torch's cast (the emulator's) gives NaN, and so does this: x * 0 + x, one FFMA where a
    compare and select take two instructions and a predicate register."""
    return tl.fma(x, 0.0, x)


@triton.jit
def maybe_masked_load(ptrs, mask, other, MASK: tl.constexpr):
    """tl.load, masked (fill ``other``) only when MASK: tiles and steps known to lie inside
    their document compile without the mask and its predicates."""
    if MASK:
        b = tl.load(ptrs, mask=mask, other=other)
    else:
        b = tl.load(ptrs)
    return b


@triton.jit
def mma(a, b, acc, INTERPRET: tl.constexpr):
    """acc + a @ b with fp32 accumulation; FP8 or BF16 wgmma on the GPU."""
    if INTERPRET:
        return tl.dot(to_fp32(a, INTERPRET), to_fp32(b, INTERPRET), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def to_output(x, DTYPE: tl.constexpr, INTERPRET: tl.constexpr):
    """fp32 -> DTYPE (bf16, fp16 or fp32), round to nearest even. The interpreter's bf16 cast
    truncates and gets subnormals wrong, so there the value is rounded on its bits and their
    upper half taken as the bf16's (a NaN as the canonical one)."""
    if INTERPRET and DTYPE == tl.bfloat16:
        bits = tl.where(x == x, round_bf16(x).to(tl.int32, bitcast=True) >> 16, 0x7FC0)
        y = bits.to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        y = x.to(DTYPE)
    return y


@triton.jit
def round_bf16(x):
    """fp32 -> fp32 on the BF16 grid, round to nearest even, on the bits (exact for every
    value: subnormals, overflow to inf). A NaN is kept as it is: the rounding carry of a NaN
    with a full payload (the GPU's 0x7FFFFFFF) would wrap into the sign bit and make it -0."""
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return tl.where(x == x, bits.to(tl.float32, bitcast=True), x)


@triton.jit
def to_codes(x, CODES: tl.constexpr, INTERPRET: tl.constexpr):
    """fp32 -> the operand format CODES (float8e4nv or bfloat16), round to nearest even."""
    if CODES == tl.bfloat16:
        y = to_output(x, tl.bfloat16, INTERPRET)
    else:
        y = to_e4m3(x, INTERPRET)
    return y


@triton.jit
def scaled(x, f, CODES: tl.constexpr):
    """x * f for f an operand's power-of-two factor (broadcast to x). BF16 codes carry no
    exponents (every one is 0, so f = 1): there x itself, bit for bit, and no multiply per
    element."""
    if CODES == tl.bfloat16:
        y = x
    else:
        y = x * f
    return y


@triton.jit
def code_grid(x, CODES: tl.constexpr, INTERPRET: tl.constexpr):
    """fp32 -> fp32 on the grid of CODES, round to nearest even (``e4m3_grid`` for E4M3).
    BF16 rounds on the bits, not through a bf16 tensor: a converted tensor that also feeds a
    wgmma is what Triton 3.6 miscompiles for FP8 (``e4m3_grid``)."""
    if CODES == tl.bfloat16:
        y = bf16_grid(x, INTERPRET)
    else:
        y = e4m3_grid(x, INTERPRET)
    return y
