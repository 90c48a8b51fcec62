"""The fused Triton quantizer (flamia/kernels/quantize.py) against its torch reference
(flamia/reference/operands.py): codes, transposed codes (in the aligned layout of
flamia/kernels/layout.py, zero outside documents) and exponents bit for bit, D within fp32
summation-order noise. Without CUDA the kernels run on Triton's CPU interpreter."""
import pytest
import torch

from flamia.kernels.configs import BF16, E4M3, QuantizerTiles
from flamia.kernels.layout import (DOC_ALIGN, T_ALIGN, aligned_starts, aligned_starts_reference, token_columns, transposed_extent,
                                   transposed_reference)
from flamia.kernels.quantize import quantize_grad_output, quantize_operand, quantize_pair
from flamia.recipes import RECIPES
from flamia.reference import operands as ref
from flamia.reference.numerics import Bf16Numerics

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Odd lengths, none a multiple of 16, a 1-token and an empty document: every document but the
# first starts off the 16-token grid in the packed rows.
LENGTHS = (37, 1, 0, 70, 9)
ZERO_ROWS = slice(38, 70)  # the first 32-token block of the 70-token document
ZERO_HEAD = 1
HEADS = 2
STEP = 64
U = 2.0**-24  # fp32 unit roundoff


def _cu_seqlens(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)


def _rows(lengths, heads: int, d: int, seed: int, dtype=torch.bfloat16) -> torch.Tensor:
    """[T, H, D] normal values with outlier channels (x20, x50, x100) and zero rows ZERO_ROWS of
    head ZERO_HEAD (for LENGTHS: one whole 32-token block)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(lengths), heads, d, generator=g)
    x[:, :, 3] *= 20
    x[:, 0, d // 2] *= 50
    x[:, 1, 17] *= 100
    x[ZERO_ROWS, ZERO_HEAD] = 0
    return x.to(device=DEVICE, dtype=dtype)


def row_factors(lengths, heads: int, seed: int) -> torch.Tensor:
    """[H, T] fp32 row factors over 40 binades, 0 (an invalid row) on every 7th token."""
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    ro = torch.rand(heads, total, generator=g) * 2.0 ** torch.randint(-20, 20, (heads, total), generator=g).float()
    ro[:, ::7] = 0
    return ro.to(DEVICE)


def _bytes(codes: torch.Tensor) -> torch.Tensor:
    """uint8 view of float8 codes, or of fp32 values on the E4M3 grid (the reference's)."""
    if codes.dtype == torch.float32:
        codes = codes.to(torch.float8_e4m3fn)  # exact: the values are on the grid
    return codes.contiguous().view(torch.uint8)


def _assert_transposed(codes_t: torch.Tensor, cu_t: torch.Tensor, codes: torch.Tensor, cu: torch.Tensor) -> None:
    """codes_t [H, D, T_t] and its document starts cu_t hold codes [T, H, D] (reference
    values) in the aligned layout, zeros outside documents."""
    assert torch.equal(cu_t, aligned_starts(cu))
    assert torch.equal(_bytes(codes_t), _bytes(transposed_reference(codes, cu)))


def _assert_operand(x: torch.Tensor, cu: torch.Tensor, max_seqlen: int, block: int, hadamard: bool) -> None:
    got = quantize_operand(x, cu, block, hadamard, transposed=True)
    want = ref.quantize_operand(x, cu, max_seqlen, block, hadamard)
    assert got.codes.dtype == got.codes_t.dtype == torch.float8_e4m3fn and got.exps.dtype == torch.int8
    assert torch.equal(_bytes(got.codes), _bytes(want.codes))
    assert torch.equal(got.exps.int(), want.exps)
    _assert_transposed(got.codes_t, got.cu_seqlens_t, want.codes, cu)


@pytest.mark.parametrize("hadamard", [False, True])
@pytest.mark.parametrize("block", [32, 1])
@pytest.mark.parametrize("d", [64, 128])
def test_operand_matches_reference(d, block, hadamard):
    x = _rows(LENGTHS, HEADS, d, seed=d + block)
    _assert_operand(x, _cu_seqlens(LENGTHS), max(LENGTHS), block, hadamard)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_operand_input_dtypes(dtype):
    x = _rows(LENGTHS, HEADS, 64, seed=5, dtype=dtype)
    _assert_operand(x, _cu_seqlens(LENGTHS), max(LENGTHS), 32, hadamard=True)


def test_operand_zero_block_and_row_major_only():
    x = _rows(LENGTHS, HEADS, 64, seed=6)
    got = quantize_operand(x, _cu_seqlens(LENGTHS), 32, transposed=False)
    assert got.codes_t is None and got.cu_seqlens_t is None
    assert (got.exps[ZERO_ROWS, ZERO_HEAD] == -100).all() and not _bytes(got.codes[ZERO_ROWS, ZERO_HEAD]).any()
    assert torch.equal(_bytes(got.codes), _bytes(ref.quantize_operand(x, _cu_seqlens(LENGTHS), max(LENGTHS), 32).codes))


def _assert_same_operand(got, want) -> None:
    assert torch.equal(_bytes(got.codes), _bytes(want.codes)) and torch.equal(got.exps, want.exps)
    assert torch.equal(_bytes(got.codes_t), _bytes(want.codes_t))
    assert torch.equal(got.cu_seqlens_t, want.cu_seqlens_t)


@pytest.mark.parametrize("hadamard", [False, True])
@pytest.mark.parametrize("lengths_k", [(3, 40, 0, 100, 1), (0, 0, 0, 0, 0)], ids=["cross", "no-keys"])
def test_pair_writes_what_two_launches_write(lengths_k, hadamard):
    """Q and K in one launch (4 query heads on 2 KV heads, each side its own documents, so one
    side's list outruns the other's; or keys without tokens) equal two single launches."""
    q = _rows(LENGTHS, 4, 64, seed=1)
    k = _rows(lengths_k, HEADS, 64, seed=2) if sum(lengths_k) else torch.zeros(0, HEADS, 64, device=DEVICE)
    k = k.to(q.dtype)
    cu_q, cu_k = _cu_seqlens(LENGTHS), _cu_seqlens(lengths_k)
    for got, x, cu in zip(quantize_pair(q, k, cu_q, cu_k, 32, hadamard), (q, k), (cu_q, cu_k)):
        _assert_same_operand(got, quantize_operand(x, cu, 32, hadamard))


def test_bf16_pair_writes_what_two_launches_write():
    q, k = _rows(LENGTHS, HEADS, 64, seed=3), _rows(LENGTHS, HEADS, 64, seed=4)
    cu = _cu_seqlens(LENGTHS)
    for got, x in zip(quantize_pair(q, k, cu, cu, 32, fmt=BF16), (q, k)):
        _assert_same_operand(got, quantize_operand(x, cu, 32, fmt=BF16))


def test_bf16_launches_without_transposed_codes_write_the_rest():
    """The bf16 route's launches (``Route.rows``: no Q^T, K^T, dOt^) write the same row codes,
    exponents and D as the ones that also write the transposed codes, and no transposed codes."""
    q, k = _rows(LENGTHS, HEADS, 64, seed=5), _rows(LENGTHS, HEADS, 64, seed=6)
    cu = _cu_seqlens(LENGTHS)
    for got, want in zip(quantize_pair(q, k, cu, cu, 32, fmt=BF16, transposed=False),
                         quantize_pair(q, k, cu, cu, 32, fmt=BF16)):
        assert got.codes_t is None and got.cu_seqlens_t is None
        assert torch.equal(_bf16_bits(got.codes), _bf16_bits(want.codes)) and torch.equal(got.exps, want.exps)
    ro = row_factors(LENGTHS, HEADS, seed=7)
    got = quantize_grad_output(q, k, ro, cu, 32, STEP, fmt=BF16, transposed=False)
    want = quantize_grad_output(q, k, ro, cu, 32, STEP, fmt=BF16)
    assert got.dot_codes_t is None and torch.equal(_bf16_bits(got.do_codes), _bf16_bits(want.do_codes))
    for name in ("do_exps", "dot_exps", "delta", "cu_seqlens_t"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name


def test_bf16_grad_output_as_its_own_codes():
    """own_codes (the bf16 route's bf16 dO): dO^ is dO itself, and the launch writes the same
    exponents, D and records as the one that writes the codes; other dtypes and formats are refused."""
    do, o = _rows(LENGTHS, HEADS, 64, seed=8), _rows(LENGTHS, HEADS, 64, seed=9)
    cu = _cu_seqlens(LENGTHS)
    ro = row_factors(LENGTHS, HEADS, seed=10)
    t = do.shape[0]
    g = torch.Generator().manual_seed(11)
    records = dict(q_exps=torch.zeros((t, HEADS), dtype=torch.int8, device=DEVICE),
                   pv=torch.zeros((t, HEADS), dtype=torch.int32, device=DEVICE),
                   m=torch.randn(HEADS, t, generator=g).to(DEVICE))
    got = quantize_grad_output(do, o, ro, cu, 32, STEP, fmt=BF16, transposed=False, own_codes=True, **records)
    want = quantize_grad_output(do, o, ro, cu, 32, STEP, fmt=BF16, transposed=False, **records)
    assert got.do_codes is do and torch.equal(_bf16_bits(want.do_codes), _bf16_bits(do))
    for name in ("do_exps", "dot_exps", "delta", "records"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    for x, fmt in ((do.half(), BF16), (do, E4M3)):
        with pytest.raises(ValueError, match="^own_codes: "):
            quantize_grad_output(x, o.to(x.dtype), ro, cu, 32, STEP, fmt=fmt, transposed=False, own_codes=True)


def test_records_without_exponents_only_for_bf16_codes():
    """Q and K that are their own BF16 codes come without exponents: the dO launch's records and
    V's key records then take eQ = eK = 0, as the zero exponents the BF16 quantizer writes give
    them; E4M3 codes without exponents are refused by name."""
    do, o, v = (_rows(LENGTHS, HEADS, 64, seed=s) for s in (12, 13, 14))
    cu, t = _cu_seqlens(LENGTHS), do.shape[0]
    ro = row_factors(LENGTHS, HEADS, seed=15)
    zeros = torch.zeros((t, HEADS), dtype=torch.int8, device=DEVICE)
    g = torch.Generator().manual_seed(16)
    rec = dict(pv=torch.zeros((t, HEADS), dtype=torch.int32, device=DEVICE),
               m=torch.randn(HEADS, t, generator=g).to(DEVICE))
    got = quantize_grad_output(do, o, ro, cu, 32, STEP, fmt=BF16, transposed=False, q_exps=None, **rec)
    want = quantize_grad_output(do, o, ro, cu, 32, STEP, fmt=BF16, transposed=False, q_exps=zeros, **rec)
    assert torch.equal(got.records, want.records)
    got = quantize_operand(v, cu, 32, fmt=BF16, key_records=True)
    assert torch.equal(got.key_rec, quantize_operand(v, cu, 32, fmt=BF16, key_exps=zeros).key_rec)
    with pytest.raises(ValueError, match="^q_exps: "):
        quantize_grad_output(do, o, ro, cu, 32, STEP, q_exps=None, **rec)
    with pytest.raises(ValueError, match="^key_exps: "):
        quantize_operand(v, cu, 32, key_records=True)

def _assert_bf16_score_codes(lengths, heads: int, d: int, block: int, hadamard: bool, seed: int) -> None:
    """``bf16_scores``' launch of Q and K (scores=2): the row codes are BF16 codes of x on the
    E4M3 codes' exponents, bit for bit the emulator's ``bf16_operand`` (an Inf kept, a NaN
    NaN); the exponents and transposed codes are the plain launch's."""
    cu = _cu_seqlens(lengths)
    q, k = _rows(lengths, heads, d, seed=seed), _rows(lengths, heads, d, seed=seed + 1)
    q[5, 0, 1], k[0, 1, 2], k[1, 1, 3] = float("inf"), float("-inf"), float("nan")
    for x, got in zip((q, k), quantize_pair(q, k, cu, cu, block, hadamard, scores=2)):
        plain = quantize_operand(x, cu, block, hadamard)
        assert torch.equal(got.exps, plain.exps)
        assert torch.equal(_bytes(got.codes_t), _bytes(plain.codes_t))
        want = ref.bf16_operand(x, got.exps.int(), hadamard)
        assert got.codes.dtype == torch.bfloat16 and torch.equal(_bf16_bits(got.codes), _bf16_bits(want.codes))


@pytest.mark.parametrize("hadamard", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_bf16_score_codes_match_emulator(d, hadamard):
    _assert_bf16_score_codes(LENGTHS, HEADS, d, 32, hadamard, seed=d + 21)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("block", [32, 1])
def test_bf16_score_codes_real_size_on_gpu(block):
    """The Gluon launch (rotated, ``rotated_quantizer.ROW_BF16``) at a real size."""
    _assert_bf16_score_codes((1000, 4096, 333), 16, 128, block, True, seed=9)


def _assert_grad_output(do: torch.Tensor, o: torch.Tensor, ro: torch.Tensor, cu: torch.Tensor, max_seqlen: int,
                        block: int, dot_values: bool = False) -> None:
    """The launch against the reference; dot_values: dOt^ as BF16 values, its codes times their
    2^edOt, bit for bit (exact), tokens in order."""
    got = quantize_grad_output(do, o, ro, cu, block, STEP, dot_values=dot_values)
    want = ref.quantize_grad_output(do, o, ro, cu, max_seqlen, block, STEP)
    assert torch.equal(_bytes(got.do_codes), _bytes(want.do.codes))
    assert torch.equal(got.do_exps.int(), want.do.exps)
    if dot_values:
        assert got.dot_codes_t.dtype == torch.bfloat16 and torch.equal(got.cu_seqlens_t, aligned_starts(cu))
        values = transposed_reference(want.dot.dequantize(), cu, torch.bfloat16).to(torch.bfloat16)
        assert torch.equal(_bf16_bits(got.dot_codes_t), _bf16_bits(values))
    else:
        _assert_transposed(got.dot_codes_t, got.cu_seqlens_t, want.dot.codes, cu)
    assert torch.equal(got.dot_exps.int(), want.dot.exps)
    # D: the same products, summed in another order. Any order errs by at most (D - 1) u
    # sum|terms|, so two orders differ by at most 2 D u sum|terms| (measured: about 2 u).
    terms = (want.do.dequantize() * o.float()).abs().sum(-1).transpose(0, 1)  # [H, T]
    assert ((got.delta - want.delta).abs() <= 2 * do.shape[2] * U * terms).all()
    invalid = ro == 0  # [H, T]
    dot = want.dot.codes.transpose(0, 1)  # [H, T, D], equal to the kernel's (above)
    assert invalid.any() and (dot[invalid] == 0).all()


@pytest.mark.parametrize("dot_values", [False, True], ids=["dot-codes", "dot-values"])
@pytest.mark.parametrize("block", [32, 1])
@pytest.mark.parametrize("d", [64, 128])
def test_grad_output_matches_reference(d, block, dot_values):
    do, o, ro = _rows(LENGTHS, HEADS, d, seed=d), _rows(LENGTHS, HEADS, d, seed=d + 1), row_factors(LENGTHS, HEADS, seed=d)
    _assert_grad_output(do, o, ro, _cu_seqlens(LENGTHS), max(LENGTHS), block, dot_values)


def test_aligned_starts():
    """cu_t = [0, cumsum(round_up(len, 128))] and T_t = round_up(T, 128) + 128 * num_docs; the
    kernel equals the torch reference over more documents than one step of its sweep."""
    assert (T_ALIGN, DOC_ALIGN) == (32, 128)
    assert aligned_starts(_cu_seqlens(LENGTHS)).tolist() == [0, 128, 256, 256, 384, 512]
    assert aligned_starts_reference(_cu_seqlens(LENGTHS)).tolist() == [0, 128, 256, 256, 384, 512]
    assert transposed_extent(sum(LENGTHS), len(LENGTHS)) == 128 + 128 * len(LENGTHS)
    lengths = torch.randint(0, 70, (2500,), generator=torch.Generator().manual_seed(0)).tolist()
    assert torch.equal(aligned_starts(_cu_seqlens(lengths)), aligned_starts_reference(_cu_seqlens(lengths)))


def test_token_columns_permute_each_16_token_group():
    """The transposed codes' token order stays inside 16-token groups (tiles of 16 or more
    tokens hold whole groups) and is the wgmma A operand's: token 8 j + 2 t + e at 4 t + 2 j + e."""
    i = torch.arange(64)
    cols = token_columns(i)
    assert torch.equal(cols // 16, i // 16) and torch.equal(cols.sort().values, i)
    assert cols[:16].tolist() == [0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15]


@pytest.mark.parametrize("hadamard", [False, True])
def test_transposed_gaps_are_zero(monkeypatch, hadamard):
    """Columns outside documents (between them and past the last) hold zero codes written by
    the launches: torch.empty is poisoned with 0xFF bytes (E4M3 NaNs), so any column a launch
    leaves unwritten shows."""
    empty = torch.empty

    def poisoned_empty(*args, **kwargs):
        out = empty(*args, **kwargs)
        if out.dtype in (torch.float8_e4m3fn, torch.bfloat16):
            out.view(torch.uint8).fill_(0xFF)
        return out

    monkeypatch.setattr(torch, "empty", poisoned_empty)
    cu, d = _cu_seqlens(LENGTHS), 64
    x = _rows(LENGTHS, HEADS, d, seed=11)
    op = quantize_operand(x, cu, 32, hadamard)
    go = quantize_grad_output(x, x, row_factors(LENGTHS, HEADS, seed=11), cu, 32, STEP)
    gv = quantize_grad_output(x, x, row_factors(LENGTHS, HEADS, seed=11), cu, 32, STEP, dot_values=True)
    for codes_t, cu_t in ((op.codes_t, op.cu_seqlens_t), (go.dot_codes_t, go.cu_seqlens_t),
                          (gv.dot_codes_t, gv.cu_seqlens_t)):
        outside = torch.ones(codes_t.shape[2], dtype=torch.bool)
        for start, length in zip(cu_t.tolist(), LENGTHS):
            outside[start + token_columns(torch.arange(length), codes_t.dtype)] = False
        assert outside.sum() > codes_t.shape[2] // 4  # gaps after 4 documents and a long tail
        assert not _bytes(codes_t[:, :, outside.to(codes_t.device)]).any()


@pytest.mark.parametrize("call, match", [
    (lambda x, cu: quantize_operand(x.float()[..., :48].contiguous(), cu), "x: head dim"),
    (lambda x, cu: quantize_operand(x.transpose(0, 1), cu), "x: expected a contiguous"),
    (lambda x, cu: quantize_operand(x, cu, block=3), "block"),
    (lambda x, cu: quantize_operand(x[..., :32].contiguous(), cu, hadamard=True), "hadamard"),
    (lambda x, cu: quantize_pair(x, x.float(), cu, cu), "k: expected q's dtype"),
    (lambda x, cu: quantize_pair(x, x, cu, cu[:-1]), "k: expected q's dtype"),
    (lambda x, cu: quantize_pair(x, x, cu, cu, fmt=BF16, scores=True), "scores"),
    (lambda x, cu: quantize_grad_output(x, x, torch.ones(2, 3, device=DEVICE), cu), "ro"),
    (lambda x, cu: quantize_grad_output(x, x, torch.ones(2, 117, device=DEVICE), cu, step=48), "step"),
    (lambda x, cu: quantize_grad_output(x, x, torch.ones(2, 117, device=DEVICE), cu, block=8, step=8), "step"),
    (lambda x, cu: quantize_grad_output(x, x, torch.ones(2, 117, device=DEVICE), cu, block=64, step=32), "block"),
    (lambda x, cu: quantize_grad_output(x, x, torch.ones(2, 117, device=DEVICE), cu, fmt=BF16, dot_values=True),
     "dot_values"),
    (lambda x, cu: quantize_grad_output(x, x, torch.ones(2, 117, device=DEVICE), cu, transposed=False,
                                        dot_values=True), "dot_values"),
])
def test_invalid_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call(_rows(LENGTHS, HEADS, 64, seed=0), _cu_seqlens(LENGTHS))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_real_size_matches_reference_on_gpu():
    lengths, heads, d = (1000, 4096, 333), 16, 128
    cu = _cu_seqlens(lengths)
    x = _rows(lengths, heads, d, seed=7)
    for block in (32, 1):
        _assert_operand(x, cu, max(lengths), block, hadamard=True)
    for dot_values in (False, True):
        _assert_grad_output(x, _rows(lengths, heads, d, seed=8), row_factors(lengths, heads, seed=9), cu, max(lengths),
                            32, dot_values)


@pytest.mark.parametrize("unit, warps", [(32, 2), (48, 1), (1024, 1)])
def test_quantizer_tiles_name_a_unit_the_rotated_launch_cannot_hold(unit, warps):
    with pytest.raises(ValueError, match="^operand_unit: "):
        QuantizerTiles(operand_unit=unit, rotated_warps=warps)


@pytest.mark.parametrize("parts", [0, 3, 8])
def test_quantizer_tiles_name_transposed_pieces_the_store_cannot_fill(parts):
    with pytest.raises(ValueError, match="^transposed_parts: "):
        QuantizerTiles(transposed_parts=parts)


def _bf16_bits(x: torch.Tensor) -> torch.Tensor:
    """int16 view of bf16 values, or of fp32 values on the bf16 grid (the emulator's); every
    NaN as one pattern (payloads are not part of the contract)."""
    x = x.to(torch.bfloat16)
    return torch.where(x.isnan(), float("nan"), x).contiguous().view(torch.int16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("d", [64, 128])
def test_bf16_operand_matches_emulator(d, dtype):
    """The bf16 recipe's operands: the same launch writes bf16(x) row-major and in the aligned
    transposed layout (tokens in order: the BF16 wgmma's A operand takes the accumulator's
    columns) and zero exponents, bit for bit the emulator's Bf16Numerics; an Inf stays Inf and
    a NaN NaN, as torch's bf16 cast keeps them."""
    x = _rows(LENGTHS, HEADS, d, seed=d + 7, dtype=dtype)
    x[5, 0, 1], x[40, 1, 2], x[41, 1, 3] = float("inf"), float("-inf"), float("nan")
    cu = _cu_seqlens(LENGTHS)
    got = quantize_operand(x, cu, 32, False, transposed=True, fmt=BF16)
    want = Bf16Numerics(RECIPES["bf16"], d).operand(x, cu, max(LENGTHS), False)
    assert got.codes.dtype == got.codes_t.dtype == torch.bfloat16 and got.exps.dtype == torch.int8
    assert torch.equal(_bf16_bits(got.codes), _bf16_bits(want.codes))
    assert not got.exps.any() and not want.exps.any()
    assert torch.equal(got.cu_seqlens_t, aligned_starts(cu))
    assert torch.equal(_bf16_bits(got.codes_t), _bf16_bits(transposed_reference(want.codes, cu, torch.bfloat16)))
    assert torch.equal(token_columns(torch.arange(40), torch.bfloat16), torch.arange(40))


def test_bf16_operand_has_no_rotation():
    with pytest.raises(ValueError, match="^hadamard: "):
        quantize_operand(_rows(LENGTHS, HEADS, 64, seed=1), _cu_seqlens(LENGTHS), 32, True, fmt=BF16)


@pytest.mark.parametrize("d", [64, 128])
def test_bf16_grad_output_matches_emulator(d):
    """dO^ = bf16(dO), dOt^ = bf16(dO ro) in the transposed layout, exponents 0, bit for bit
    the emulator's; D within fp32 summation-order noise."""
    do, o, ro = _rows(LENGTHS, HEADS, d, seed=d), _rows(LENGTHS, HEADS, d, seed=d + 1), row_factors(LENGTHS, HEADS, seed=d)
    cu = _cu_seqlens(LENGTHS)
    got = quantize_grad_output(do, o, ro, cu, 32, STEP, fmt=BF16)
    want = Bf16Numerics(RECIPES["bf16"], d).grad_output(do, o, ro, cu, max(LENGTHS), STEP)
    assert got.do_codes.dtype == got.dot_codes_t.dtype == torch.bfloat16
    assert torch.equal(_bf16_bits(got.do_codes), _bf16_bits(want.do.codes))
    assert not got.do_exps.any() and not got.dot_exps.any()
    assert torch.equal(_bf16_bits(got.dot_codes_t), _bf16_bits(transposed_reference(want.dot.codes, cu,
                                                                                     torch.bfloat16)))
    terms = (want.do.codes * o.float()).abs().sum(-1).transpose(0, 1)  # [H, T]
    assert ((got.delta - want.delta).abs() <= 2 * d * U * terms).all()
