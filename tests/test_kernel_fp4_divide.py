"""``fp4.divide_by_scale``: NVFP4's x / (s * g) without a division per element, and the
interpreter's fma rounded once (``fp8.fma_f32``), which its correction needs. The correction
is checked on every fp32 significand against every E4M3 scale significand (scaling by powers
of two is exact between 2^-126 and the overflow, so that covers every normal quotient), then
the kernel helper against torch's division over the scales, exponents and edges the
quantizers meet. Without CUDA the kernel runs on Triton's CPU interpreter."""
from fractions import Fraction

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from flamia.kernels.fp4 import divide_by_scale, past_e2m1_max
from flamia.kernels.fp8 import fma_f32

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32 = np.float32


def _rn32(value: Fraction) -> F32:
    """The float32 nearest an exact rational, ties to the even significand."""
    near = F32(float(value))
    candidates = [near, np.nextafter(near, F32(np.inf)), np.nextafter(near, F32(-np.inf))]
    return min(candidates, key=lambda c: (abs(Fraction(float(c)) - value), int(np.array(c).view(np.int32)) & 1))


def test_fma_f32_rounds_once():
    """Random products cancelling against an addend to 1-40 bits, where rounding the product
    first is wrong in nearly every case, and sums whose float64 rounding lands on a float32
    tie (exact below it, above it, and on it), signed zeros, subnormal ties, inf * 0."""
    rng = np.random.default_rng(0)
    n = 4000
    x = (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)).astype(F32)
    y = (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)).astype(F32)
    z = (-(x.astype(np.float64) * y) * (1 + rng.standard_normal(n) * 2.0 ** -rng.integers(1, 40, n))).astype(F32)
    got = fma_f32(x, y, z)
    want = np.array([_rn32(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))) for a, b, c in zip(x, y, z)])
    assert np.array_equal(got, want)
    assert not np.array_equal((x * y) + z, want)  # the interpreter's own fma
    one_ulp, below_half = 1 + 2.0**-23, 2.0**-24 * (1 - 2.0**-23)  # (1 + 2^-23) 2^-24 (1 - 2^-23) = 2^-24 - 2^-70
    x = np.array([one_ulp, one_ulp, -one_ulp, 0.0, -0.0, 2.0**-75, np.inf], F32)
    y = np.array([below_half, below_half, below_half, -1.0, 1.0, 2.0**-75, 0.0], F32)
    z = np.array([one_ulp, 1.0, -one_ulp, -0.0, -0.0, 2.0**-149, 1.0], F32)
    got = fma_f32(x, y, z)
    assert got[:6].tolist() == [one_ulp, 1.0, -one_ulp, -0.0, -0.0, 2.0**-148] and np.isnan(got[6])
    assert np.signbit(got[3]) and np.signbit(got[4])


def _rn32_quotients(significands: np.ndarray, m: int) -> np.ndarray:
    """float32 RN(a / s), a = A 2^-23 for int64 significands A in [2^23, 2^24), s = m / 8,
    from integer division: the quotient's 24 leading bits, rounded half to even on the rest
    and the remainder."""
    n = significands << 28  # A 2^28 / m lies in [2^47, 2^49)
    q, rem = n // m, n % m
    shift = np.where(q >= 1 << 48, 25, 24)  # bits below the 24 kept ones
    keep, rest = q >> shift, q & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    up = (rest > half) | ((rest == half) & ((rem > 0) | (keep & 1 == 1)))
    return np.ldexp((keep + up).astype(np.float64), shift - 48).astype(F32)


@pytest.mark.parametrize("m", range(9, 16))
def test_correction_is_exact_for_every_significand(m):
    """For s = m / 8 (every E4M3 significand but 1, whose reciprocal is exact) and every
    a in [1, 2): q = a * RN(1 / s), then RN(q + RN(a - q s) RN(1 / s)), each fma rounded once,
    is RN(a / s). Both are scale-free while a, s and the quotient stay normal fp32."""
    s = F32(m / 8)
    y = F32(1.0) / s  # numpy's float32 division rounds once
    assert Fraction(float(y)) == Fraction(float(_rn32(Fraction(8, m))))
    for start in range(1 << 23, 1 << 24, 1 << 21):  # in pieces, to bound the memory
        significands = np.arange(start, start + (1 << 21), dtype=np.int64)
        a = np.ldexp(significands.astype(np.float64), -23).astype(F32)
        q = a * y
        q = fma_f32(fma_f32(-q, s, a), y, q)
        want = _rn32_quotients(significands, m)
        assert np.array_equal(q, want), significands[q != want][:4]


@triton.jit
def _divide_kernel(p_x, p_s, p_g, p_q, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    x = tl.load(p_x + o, mask=m, other=0.0)
    s = tl.load(p_s + o, mask=m, other=1.0)
    g = tl.load(p_g + o, mask=m, other=1.0)
    tl.store(p_q + o, divide_by_scale(x, s, g), mask=m)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


def test_divide_by_scale_matches_division():
    _assert_divide_matches_division(1 << 17, DEVICE)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_divide_by_scale_on_gpu():
    """The GPU's own fma and reciprocal (the gate runs the gpu tests alone)."""
    _assert_divide_matches_division(1 << 22, "cuda")


def _assert_divide_matches_division(n: int, device: str) -> None:
    """Every positive E4M3 scale (and the 480 of a step up from 448) times g from 2^-102 (the
    smallest block exponent's) to 2^125 where s g stays below the fp32 maximum / 6 (a
    block's amax / 6 bounds it), and x from 1792 g (the largest a block holds) down to fp32
    subnormals, both signs and zeros: the quotient is torch's x / (s g) bit for bit
    where that is a nonzero normal number, and agrees with it on zero and sign below 2^-126."""
    e4m3 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    scales = torch.cat([e4m3[torch.isfinite(e4m3) & (e4m3 > 0)].unique(), torch.tensor([480.0])])
    gen = torch.Generator().manual_seed(0)
    s = scales[torch.randint(0, scales.numel(), (n,), generator=gen)]
    g = torch.ldexp(torch.ones(n), torch.randint(-102, 126, (n,), generator=gen))
    # a block's groups have s g <= amax / 6 (NUMERICS.md 6): finite
    g = torch.where(s.double() * g.double() * 6 > torch.finfo(torch.float32).max, g * 2.0**-20, g)
    # |x| / (s g): from 6.1 (past every E2M1 value) down by up to 2^200, so every rounding
    # regime of the quotient shows: normal, subnormal, zero; x itself subnormal at times
    ratio = torch.rand(n, generator=gen) * 6.1 * torch.ldexp(torch.ones(n), -torch.randint(0, 200, (n,), generator=gen))
    x = torch.minimum(ratio * s.double() * g.double(), 1792 * g.double()).clamp(max=torch.finfo(torch.float32).max).float()
    x = torch.where(torch.rand(n, generator=gen) < 0.5, -x, x)
    x[:64] = torch.tensor([0.0, -0.0] * 32)
    # the E2M1 midpoints' fp32 neighbours times s g: the ties the rounding after this reads
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    near = (ties.view(torch.int32)[:, None] + torch.arange(-2, 3, dtype=torch.int32)).flatten().view(torch.float32)
    x[64:64 + near.numel()] = (near * s[64:64 + near.numel()] * g[64:64 + near.numel()])
    x, s, g = x.to(device), s.to(device), g.to(device)
    got = torch.empty_like(x)
    _divide_kernel[(triton.cdiv(n, 1024),)](x, s, g, got, n, BLOCK=1024)
    want = x / (s * g)  # s * g: exact (4 significant bits, g >= 2^-102)
    normal = want.abs() >= 2.0**-126
    assert normal.sum() > n // 4 and (~normal & (want != 0)).sum() > 100  # both regimes are reached
    assert torch.equal(_bits(got[normal]), _bits(want[normal]))
    assert torch.equal(got[~normal] == 0, want[~normal] == 0)
    assert torch.equal(got[~normal] < 0, want[~normal] < 0)


@triton.jit
def _past_max_kernel(p_a, p_p, p_out, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(p_out + o, past_e2m1_max(tl.load(p_a + o), tl.load(p_p + o)).to(tl.int8))


def test_past_e2m1_max_is_the_quotients_comparison():
    """``fp4.past_e2m1_max(a, p)`` against torch's fp32 a / p > 6, for p = s g over every E4M3
    scale s (0 and the subnormals included) and g from 2^-126 to 2^100, with a at 6 p and up
    to 8 fp32 steps either side (the quotient's rounding boundary 6 + 2^-22 lies among them),
    at 3 p and 12 p (where the fma's difference stops being exact) and their neighbours,
    and at 0, the smallest subnormal, NaN and infinity."""
    e4m3 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    s = e4m3[torch.isfinite(e4m3) & (e4m3 >= 0)].unique()
    g = torch.ldexp(torch.ones(8), torch.tensor([-126, -120, -100, -60, -8, 0, 40, 100]))
    p = (s[:, None] * g[None, :]).flatten()  # exact: 4 significant bits, at least 2^-138
    edges = []
    for base in (6 * p, 3 * p, 12 * p):
        up = down = base
        edges.append(base)
        for _ in range(8):
            up, down = torch.nextafter(up, torch.tensor(np.inf)), torch.nextafter(down, torch.tensor(0.0))
            edges += [up, down]
    a = torch.cat(edges)
    p_all = p.repeat(len(edges))
    specials = torch.tensor([0.0, 2.0 ** -149, float("nan"), float("inf"), 1.0, 7.0])
    a = torch.cat([a, specials.repeat_interleave(len(p)), torch.zeros(len(p))])
    p_all = torch.cat([p_all, p.repeat(len(specials)), torch.zeros(len(p))])
    want = (a / p_all) > 6
    assert want.any() and not want.all()
    n = triton.next_power_of_2(len(a))
    pad = n - len(a)
    a_dev = torch.cat([a, torch.zeros(pad)]).to(DEVICE)
    p_dev = torch.cat([p_all, torch.ones(pad)]).to(DEVICE)
    out = torch.empty(n, dtype=torch.int8, device=DEVICE)
    _past_max_kernel[(1,)](a_dev, p_dev, out, N=n)
    got = out[:len(a)].bool().cpu()
    assert torch.equal(got, want), (a[got != want][:4], p_all[got != want][:4])
