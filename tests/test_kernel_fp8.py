"""The E4M3 rounding helpers of flamia/kernels/fp8.py against torch's float8_e4m3fn cast
(round to nearest even): every grid value, every tie between neighbours, values between
them over the whole range including subnormals, and signed zeros, bit for bit. On the CPU
``e4m3_grid`` runs its interpreter path (``round_e4m3``); on the GPU its PTX round trip."""
import pytest
import torch
import triton
import triton.language as tl

from flamia.kernels.fp8 import e4m3_grid, interpreting, round_bf16

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BLOCK = 1024


@triton.jit
def _grid_kernel(p_x, p_y, n, BLOCK: tl.constexpr, INTERPRET: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(p_x + o, mask=o < n, other=0.0)
    tl.store(p_y + o, e4m3_grid(x, INTERPRET), mask=o < n)


def _values() -> torch.Tensor:
    """fp32 values in [-448, 448]: the grid, the midpoints of neighbours (ties), random
    values over every binade down to below the smallest subnormal (2^-9), and +-0."""
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = codes[codes.isfinite()].unique()  # sorted, -448 .. 448, one zero
    ties = (grid[1:] + grid[:-1]) / 2  # exact in fp32
    g = torch.Generator().manual_seed(0)
    mags = torch.rand(20000, generator=g) * 2.0 ** torch.randint(-14, 9, (20000,), generator=g).float()
    signs = torch.where(torch.rand(20000, generator=g) < 0.5, -1.0, 1.0)
    rand = (mags * signs).clamp(-448, 448)
    return torch.cat([grid, ties, rand, torch.tensor([0.0, -0.0, 2.0**-10, -(2.0**-10), 2.0**-11])])


def _run(x: torch.Tensor) -> torch.Tensor:
    x = x.to(DEVICE)
    y = torch.empty_like(x)
    _grid_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, y, x.numel(), BLOCK=BLOCK, INTERPRET=interpreting())
    return y.cpu()


def _assert_rounds_like_torch(x: torch.Tensor) -> None:
    want = x.to(torch.float8_e4m3fn).float()
    got = _run(x)
    bad = (got.view(torch.int32) != want.view(torch.int32)).nonzero().flatten()
    assert bad.numel() == 0, f"{bad.numel()} values differ, e.g. x={x[bad[:4]].tolist()} " \
                             f"got={got[bad[:4]].tolist()} want={want[bad[:4]].tolist()}"


def test_e4m3_grid_rounds_to_nearest_even_bit_for_bit():
    _assert_rounds_like_torch(_values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_e4m3_grid_ptx_round_trip_matches_on_gpu():
    """The PTX path (cvt.rn.satfinite.e4m3x2.f32 and back), on a million random values too."""
    g = torch.Generator().manual_seed(1)
    many = torch.randn(1 << 20, generator=g) * 2.0 ** torch.randint(-14, 7, (1 << 20,), generator=g).float()
    _assert_rounds_like_torch(torch.cat([_values(), many.clamp(-448, 448)]))


@triton.jit
def _bf16_grid_kernel(p_x, p_y, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(p_y + o, round_bf16(tl.load(p_x + o, mask=o < n)), mask=o < n)


def test_round_bf16_keeps_every_nan_and_rounds_like_torch():
    """NaNs of every payload stay NaN (the GPU's own NaN, 0x7FFFFFFF, once rounded to -0 and
    hid a poisoned row's P from dV), and finite values round as torch's bf16 cast does."""
    nan_bits = torch.tensor([0x7FFFFFFF, 0x7FC00000, 0x7F800001, 0x7FFF8000, -1, -0x400000], dtype=torch.int32)
    x = torch.cat([nan_bits.view(torch.float32), _values()]).to(DEVICE)
    y = torch.empty_like(x)
    _bf16_grid_kernel[(1,)](x, y, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    assert torch.isnan(y[:nan_bits.numel()]).all()
    finite = x[nan_bits.numel():]
    keep = torch.isfinite(finite)
    assert torch.equal(y[nan_bits.numel():][keep], finite[keep].to(torch.bfloat16).float())
