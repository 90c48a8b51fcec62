"""The all-4-bit route's quantizer launches (flamia/kernels/quantize_fp4.py: quantize_fp4_operand,
quantize_fp4_pair, quantize_fp4_grad_output) against their torch reference
(flamia/reference/operands_fp4.py): the decoded bf16 values of every representation bit for bit
(row-major codes, the transposed token-axis and per-token values in the aligned layout of
flamia/kernels/layout.py, zero outside documents), zero exponents, the key and query records,
D within fp32 summation-order noise. Every output starts as 0xFF bytes, so a value no launch
writes shows. Without CUDA the kernels run on Triton's CPU interpreter."""
import pytest
import torch

from flamia.formats.hadamard import hadamard_transform
from flamia.kernels.configs import E4M3
from flamia.kernels.layout import aligned_starts, transposed_reference
from flamia.kernels.quantize import quantize_grad_output
from flamia.kernels.quantize_fp4 import quantize_fp4_grad_output, quantize_fp4_operand, quantize_fp4_pair
from flamia.kernels.records import key_records, query_records
from flamia.kernels.worklist import tile_list
from flamia.reference import operands_fp4 as ref
from test_kernel_quantize import row_factors as _ro  # 0 on every 7th token: dO ro is -0 where dO < 0

# The interpreter's numpy warns on the 0 / 0 of zero NVFP4 scales, which the kernel computes
# where the reference does, and on the non-finite inputs of the NaN test.
pytestmark = pytest.mark.filterwarnings("ignore:(invalid value|divide by zero|overflow) encountered:RuntimeWarning")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Odd lengths, none a multiple of 16, a 1-token and an empty document: every document but the
# first starts off the 16-token grid in the packed rows.
LENGTHS = (37, 1, 0, 70, 9)
ZERO_ROWS = slice(38, 54)  # one whole 16-token group of the 70-token document
HEADS = 2
STEP = 64
U = 2.0**-24  # fp32 unit roundoff


@pytest.fixture(autouse=True)
def poisoned_empty(monkeypatch):
    """torch.empty fills with 0xFF bytes (bf16 NaNs, int -1): any output a launch leaves
    unwritten differs from the reference."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        out = empty(*args, **kwargs)
        out.view(torch.uint8).fill_(0xFF)
        return out

    monkeypatch.setattr(torch, "empty", poisoned)


def _cu_seqlens(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)


def _rows(lengths, heads: int, d: int, seed: int, dtype=torch.bfloat16) -> torch.Tensor:
    """[T, H, D] normal values with outlier channels (x20, x50, x100), a zero 16-token group
    ZERO_ROWS of head 1, -0 entries (their sign is kept where they round to 0) and, for fp32,
    a row of magnitude 1e-37 (its exponents clamp at -100) beside a group holding 1e6 and
    1e-40 (the small value's scaled form underflows)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(lengths), heads, d, generator=g)
    x[:, :, 3] *= 20
    x[:, 0, d // 2] *= 50
    x[:, heads - 1, 17] *= 100
    x[ZERO_ROWS, heads - 1] = 0
    x[::5, 0, 7] = -0.0
    if dtype == torch.float32:
        x[6, 0] *= 1e-37
        x[16:32, 0, 5] = 1e-40
        x[20, 0, 5] = 1e6
    return x.to(device=DEVICE, dtype=dtype)


def _bits(x: torch.Tensor) -> torch.Tensor:
    """int16 view of bf16 values, or of fp32 values exact in bf16 (the reference's), so that
    equal means bitwise equal, zeros' signs included."""
    y = x.to(torch.bfloat16)
    assert torch.equal(y.float().isnan(), x.float().isnan()) and (y.float() == x.float())[~x.float().isnan()].all()
    return y.contiguous().view(torch.int16)


def _assert_transposed(got: torch.Tensor, values: torch.Tensor, cu: torch.Tensor) -> None:
    """got [H, D, T_t] bf16 holds the reference's values [T, H, D] fp32 in the aligned layout
    (tokens in order for bf16), zeros outside documents."""
    assert got.dtype == torch.bfloat16
    assert torch.equal(_bits(got), _bits(transposed_reference(values, cu, torch.bfloat16)))


def _assert_operand(got, x: torch.Tensor, cu: torch.Tensor, hadamard: bool, diagonal: bool) -> None:
    """One launch's operand equals the reference's representations of x bit for bit."""
    total, heads, d = x.shape
    assert got.codes.dtype == torch.bfloat16 and got.codes.shape == x.shape
    assert got.exps.dtype == torch.int8 and got.exps.shape == (total, heads) and not got.exps.any()
    assert torch.equal(got.cu_seqlens_t, aligned_starts(cu))
    assert (got.codes_t_diag is not None) == diagonal
    if not total:  # no launch (the reference cannot pad nothing): zero transposed values
        assert not got.codes_t.view(torch.int16).any() and (not diagonal or not got.codes_t_diag.view(torch.int16).any())
        return
    xf = hadamard_transform(x.cpu()) if hadamard else x.cpu().float()
    cu_cpu = cu.cpu()
    assert torch.equal(_bits(got.codes.cpu()), _bits(ref.nvfp4_operand(x.cpu(), rotate=hadamard).dequantize()))
    _assert_transposed(got.codes_t.cpu(), ref.token_axis_values(xf, cu_cpu, max(1, int(cu_cpu.diff().max()))), cu_cpu)
    if diagonal:
        _assert_transposed(got.codes_t_diag.cpu(), ref.per_token_values(xf), cu_cpu)


@pytest.mark.parametrize("hadamard", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_operand_matches_reference(d, hadamard):
    """V's launch (codes_t_diag and the key records) and a plain one (Q's form), rotated or not."""
    cu = _cu_seqlens(LENGTHS)
    x = _rows(LENGTHS, HEADS, d, seed=d + hadamard)
    got = quantize_fp4_operand(x, cu, hadamard, diagonal=True, key_records=True)
    _assert_operand(got, x, cu, hadamard, diagonal=True)
    zeros = torch.zeros(x.shape[:2], dtype=torch.int8, device=DEVICE)
    assert torch.equal(got.key_rec, key_records(zeros, zeros))
    assert (got.key_rec == (127 << 23) | (127 << 15)).all()
    plain = quantize_fp4_operand(x, cu, hadamard, work=got.work, cu_seqlens_t=got.cu_seqlens_t)
    assert plain.key_rec is None
    _assert_operand(plain, x, cu, hadamard, diagonal=False)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_operand_input_dtypes(dtype):
    """fp32 inputs reach the clamped exponents, the zero NVFP4 scale stepped up from an
    underflowed ratio and the underflowing scaled values; fp16 holds none of them."""
    cu = _cu_seqlens(LENGTHS)
    x = _rows(LENGTHS, HEADS, 64, seed=5, dtype=dtype)
    _assert_operand(quantize_fp4_operand(x, cu, True, diagonal=True), x, cu, True, diagonal=True)
    _assert_operand(quantize_fp4_operand(x, cu, False, diagonal=True), x, cu, False, diagonal=True)


def _assert_same_operand(got, want) -> None:
    for name in ("codes", "codes_t", "codes_t_diag", "exps", "cu_seqlens_t", "work"):
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None and b is None) or torch.equal(a, b), name


@pytest.mark.parametrize("hadamard", [False, True])
@pytest.mark.parametrize("lengths_k", [(3, 40, 0, 100, 1), (0, 0, 0, 0, 0)], ids=["cross", "no-keys"])
def test_pair_writes_what_two_launches_write(lengths_k, hadamard):
    """Q (no codes_t_diag) and K (codes_t_diag) in one launch (4 query heads on 2 KV heads, each side its
    own documents, so one side's list outruns the other's; or keys without tokens) equal two
    single launches, which equal the reference."""
    q = _rows(LENGTHS, 4, 64, seed=1)
    k = _rows(lengths_k, HEADS, 64, seed=2)
    cu_q, cu_k = _cu_seqlens(LENGTHS), _cu_seqlens(lengths_k)
    got_q, got_k = quantize_fp4_pair(q, k, cu_q, cu_k, hadamard)
    _assert_same_operand(got_q, quantize_fp4_operand(q, cu_q, hadamard))
    _assert_same_operand(got_k, quantize_fp4_operand(k, cu_k, hadamard, diagonal=True))
    _assert_operand(got_q, q, cu_q, hadamard, diagonal=False)
    _assert_operand(got_k, k, cu_k, hadamard, diagonal=True)


def _assert_grad_output(do, o, ro, cu, sigma: int, step: int = STEP) -> None:
    """do_codes and dot_codes_t bit for bit, exponents 0, D within summation-order noise, the
    query records those of records.query_records over the same inputs (zero dO exponents)."""
    total, heads, d = do.shape
    g = torch.Generator().manual_seed(d)
    q_exps = torch.zeros(total, heads, dtype=torch.int8, device=DEVICE)  # the fp4 Q's
    pv = torch.randint(-100, 28, (total, 1), generator=g, dtype=torch.int32).to(DEVICE)
    m = torch.randn(heads, total, generator=g).to(DEVICE)
    got = quantize_fp4_grad_output(do, o, ro, cu, step, q_exps=q_exps, pv=pv, m=m, sigma=sigma)
    cu_cpu = cu.cpu()
    want = ref.quantize_fp4_grad_output(do.cpu(), o.cpu(), ro.cpu(), cu_cpu, int(cu_cpu.diff().max()))
    assert got.do_codes.dtype == torch.bfloat16
    assert torch.equal(_bits(got.do_codes.cpu()), _bits(want.do.dequantize()))
    _assert_transposed(got.dot_codes_t.cpu(), want.dot.codes, cu_cpu)
    assert torch.equal(got.cu_seqlens_t, aligned_starts(cu))
    assert not got.do_exps.any() and not got.dot_exps.any() and got.dot_exps.shape == (total, heads)
    # D: the same products, summed in another order. Any order errs by at most (D - 1) u
    # sum|terms|, so two orders differ by at most 2 D u sum|terms|.
    terms = (want.do.dequantize() * o.cpu().float()).abs().sum(-1).transpose(0, 1)  # [H, T]
    assert ((got.delta.cpu() - want.delta).abs() <= 2 * d * U * terms).all()
    assert torch.equal(got.records, query_records(q_exps, torch.zeros_like(q_exps), pv, m, ro, got.delta, sigma))


@pytest.mark.parametrize("d", [64, 128])
def test_grad_output_matches_reference(d):
    lengths = LENGTHS
    do, o, ro = _rows(lengths, HEADS, d, seed=d), _rows(lengths, HEADS, d, seed=d + 1), _ro(lengths, HEADS, seed=d)
    _assert_grad_output(do, o, ro, _cu_seqlens(lengths), sigma=5)


def test_grad_output_without_records_and_fp32_inputs():
    do, o = _rows(LENGTHS, HEADS, 64, seed=3, dtype=torch.float32), _rows(LENGTHS, HEADS, 64, seed=4)
    ro, cu = _ro(LENGTHS, HEADS, seed=3), _cu_seqlens(LENGTHS)
    got = quantize_fp4_grad_output(do, o, ro, cu, 32)
    want = ref.quantize_fp4_grad_output(do.cpu(), o.cpu(), ro.cpu(), cu.cpu(), max(LENGTHS))
    assert got.records is None
    assert torch.equal(_bits(got.do_codes.cpu()), _bits(want.do.dequantize()))
    _assert_transposed(got.dot_codes_t.cpu(), want.dot.codes, cu.cpu())


def test_non_finite_values_stay_non_finite():
    """A NaN or an Inf makes its NVFP4 row (token, head) NaN, where the reference refuses the
    row; in the token-axis and per-token values the non-finite value stays itself and the
    rest of its group is the reference's (a NaN maximum zeroes them, an Inf one too); every
    other value is the clean input's."""
    cu = _cu_seqlens(LENGTHS)
    x = _rows(LENGTHS, HEADS, 64, seed=9)
    bad = x.clone()
    bad[3, 0, 5], bad[60, 1, 7] = float("nan"), float("inf")
    got, clean = (quantize_fp4_operand(y, cu, diagonal=True) for y in (bad, x))
    poisoned = torch.zeros(x.shape[:2], dtype=torch.bool, device=DEVICE)
    poisoned[3, 0] = poisoned[60, 1] = True
    assert got.codes[poisoned].isnan().all()
    assert torch.equal(got.codes[~poisoned], clean.codes[~poisoned])
    cu_cpu, xf = cu.cpu(), bad.cpu().float()
    for values, want in ((got.codes_t, ref.token_axis_values(xf, cu_cpu, max(LENGTHS))),
                         (got.codes_t_diag, ref.per_token_values(xf))):
        want_t = transposed_reference(want, cu_cpu, torch.bfloat16)
        nan = want_t.isnan()
        assert nan.sum() == 1 and torch.equal(values.cpu().isnan(), nan)
        assert torch.equal(_bits(values.cpu()[~nan]), _bits(want_t[~nan]))
        assert want_t.isinf().sum() == 1


def test_reuses_a_work_list_and_no_tokens():
    cu = _cu_seqlens(LENGTHS)
    x = _rows(LENGTHS, HEADS, 64, seed=4)
    work = tile_list(cu, x.shape[0], 32, reverse=False, empty_docs=True)
    _assert_same_operand(quantize_fp4_operand(x, cu, work=work), quantize_fp4_operand(x, cu))
    empty = quantize_fp4_operand(x[:0], _cu_seqlens((0, 0)), diagonal=True, key_records=True)
    assert empty.codes.shape == (0, HEADS, 64) and empty.exps.shape == (0, HEADS) and empty.work is None
    assert empty.codes_t.shape == empty.codes_t_diag.shape == (HEADS, 64, 256)
    assert not empty.codes_t.view(torch.int16).any() and not empty.codes_t_diag.view(torch.int16).any()
    assert empty.key_rec.shape == (HEADS, 0)
    go = quantize_fp4_grad_output(x[:0], x[:0], torch.zeros(HEADS, 0, device=DEVICE), _cu_seqlens((0,)))
    assert go.do_codes.shape == (0, HEADS, 64) and not go.dot_codes_t.view(torch.int16).any()


def _ro_ones(x: torch.Tensor) -> torch.Tensor:
    return torch.ones(HEADS, x.shape[0], device=DEVICE)


def _ints(*shape) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.int32, device=DEVICE)


def _records_call(x, cu, heads_kv: int, sigma: int):
    """quantize_fp4_grad_output with the records' inputs, pv for heads_kv KV heads."""
    ro = _ro_ones(x)
    return quantize_fp4_grad_output(x, x, ro, cu, q_exps=torch.zeros(x.shape[:2], dtype=torch.int8, device=DEVICE),
                                    pv=_ints(x.shape[0], heads_kv), m=ro, sigma=sigma)


@pytest.mark.parametrize("call, match", [
    (lambda x, cu: quantize_fp4_operand(x[..., :48].contiguous(), cu), "x: head dim"),
    (lambda x, cu: quantize_fp4_operand(x.transpose(0, 1), cu), "x: expected a contiguous"),
    (lambda x, cu: quantize_fp4_operand(x.double(), cu), "x: expected a contiguous"),
    (lambda x, cu: quantize_fp4_operand(x[..., :32].contiguous(), cu, hadamard=True), "hadamard"),
    (lambda x, cu: quantize_fp4_operand(x, cu.long()), "cu_seqlens"),
    (lambda x, cu: quantize_fp4_operand(x, cu, cu_seqlens_t=cu[:-1]), "cu_seqlens_t"),
    (lambda x, cu: quantize_fp4_operand(x, cu, work=_ints(2, 3)), "work"),
    (lambda x, cu: quantize_fp4_pair(x, x.float(), cu, cu), "k: expected q's dtype"),
    (lambda x, cu: quantize_fp4_pair(x, x, cu, cu[:-1]), "k: expected q's dtype"),
    (lambda x, cu: quantize_fp4_pair(x.transpose(0, 1), x, cu, cu), "q: expected a contiguous"),
    (lambda x, cu: quantize_fp4_pair(x, x, cu, cu.long()), "cu_seqlens_k"),
    (lambda x, cu: quantize_fp4_pair(x, x, cu, cu, cu_seqlens_kt=cu.long()), "cu_seqlens_kt"),
    (lambda x, cu: quantize_fp4_grad_output(x.double(), x, _ro_ones(x), cu), "do: expected a contiguous"),
    (lambda x, cu: quantize_fp4_grad_output(x, x[:, :1].contiguous(), _ro_ones(x), cu), "o: expected the shape"),
    (lambda x, cu: quantize_fp4_grad_output(x, x, _ro_ones(x)[:, :3], cu), "ro"),
    (lambda x, cu: quantize_fp4_grad_output(x, x, _ro_ones(x), cu, step=48), "step"),
    (lambda x, cu: _records_call(x, cu, heads_kv=3, sigma=0), "pv"),
    (lambda x, cu: _records_call(x, cu, heads_kv=1, sigma=28), "sigma"),
    (lambda x, cu: quantize_grad_output(x, x, _ro_ones(x), cu, fmt=E4M3, fp4=True), "fp4"),
])
def test_invalid_arguments_are_named(call, match):
    with pytest.raises(ValueError, match="^" + match):
        call(_rows(LENGTHS, HEADS, 64, seed=0), _cu_seqlens(LENGTHS))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("hadamard", [False, True])
def test_real_size_matches_reference_on_gpu(hadamard):
    lengths, d = (1000, 4096, 333), 128
    cu = _cu_seqlens(lengths)
    q, k = _rows(lengths, 16, d, seed=7), _rows(lengths, 4, d, seed=8)
    got_q, got_k = quantize_fp4_pair(q, k, cu, cu, hadamard)
    _assert_operand(got_q, q, cu, hadamard, diagonal=False)
    _assert_operand(got_k, k, cu, hadamard, diagonal=True)
    v = quantize_fp4_operand(k, cu, diagonal=True, key_records=True)
    _assert_operand(v, k, cu, False, diagonal=True)
    assert (v.key_rec == (127 << 23) | (127 << 15)).all()
    _assert_grad_output(q, _rows(lengths, 16, d, seed=9), _ro(lengths, 16, seed=10), cu, sigma=5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("d, step", [(64, 64), (128, 32), (128, 64)])
def test_grad_output_steps_match_reference_on_gpu(d, step):
    """The GPU's dO launch (fp4_quantizer_gluon.py: its warps follow the step and head dim) on odd,
    one-token and empty documents, at the kernels' steps (32 for the BF16-code tiles at d=128)."""
    do, o, ro = _rows(LENGTHS, 4, d, seed=d + step), _rows(LENGTHS, 4, d, seed=1), _ro(LENGTHS, 4, seed=step)
    _assert_grad_output(do, o, ro, _cu_seqlens(LENGTHS), sigma=3, step=step)
