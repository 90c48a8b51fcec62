"""flamia/kernels/records.py: the Triton decoders give back exactly what the builders were
given: m, ro 2^edO 2^eQ and delta / 2^edO bit for bit as torch's IEEE product and quotient, over
every fp32 bit pattern class (+-inf, -0, subnormals), and the powers of two 2^eQ,
2^(sigma - PV), 2^eK, 2^eV exactly (torch.ldexp) over the
quantizers' exponent range [EXP_MIN, EXP_MAX], PV's range (with 0, for rows that see no
key), and GQA; rows past a document's end read m = +inf and zeros, keys past it read 1. On
the CPU the decoders run on Triton's interpreter."""
import pytest
import torch
import triton
import triton.language as tl

from flamia.formats.scales import EXP_MAX, EXP_MIN
from flamia.kernels.records import (block_key_records, key_records, packed_key_factors, query_fields,
                                    query_fields_by_word, query_records, record_factors)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
N = 64  # rows per program


@triton.jit
def _query_kernel(p_rec, p_out, n, N: tl.constexpr, BY_WORD: tl.constexpr):
    """Program h: the fields [5, N] of rows 0..N-1 of query head h (rows >= n masked), read
    as 16-byte records or (BY_WORD, the Gluon dQ kernel's reader) word by word."""
    h = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, N)
    if BY_WORD:
        fields = query_fields_by_word(p_rec + h * n * 4, o, o < n)
    else:
        fields = query_fields(p_rec + h * n * 4, o, o < n, True)
    for f in tl.static_range(5):
        tl.store(p_out + (h * 5 + f) * N + o, fields[f])


@triton.jit
def _key_kernel(p_krec, p_kout, n, N: tl.constexpr):
    """Program h: (kf, vf) [2, N] of keys 0..N-1 of KV head h (keys >= n masked)."""
    h = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, N)
    kf, vf = packed_key_factors(p_krec + h * n, o, o < n, True)
    tl.store(p_kout + (h * 2) * N + o, kf)
    tl.store(p_kout + (h * 2 + 1) * N + o, vf)


@triton.jit
def _block_key_kernel(p_krec, p_kout, n, k_lo, N: tl.constexpr, BLOCK: tl.constexpr):
    """(kf, vf) [2, N] of keys k_lo..k_lo+N-1 of KV head 0 read once per BLOCK keys."""
    kf, vf = record_factors(block_key_records(p_krec, k_lo, tl.arange(0, N), n, BLOCK, N))
    tl.store(p_kout + tl.arange(0, N), kf)
    tl.store(p_kout + N + tl.arange(0, N), vf)


def _inputs(t: int, hq: int, hkv: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    i8 = lambda *s: torch.randint(EXP_MIN, EXP_MAX + 1, s, generator=g).to(torch.int8)
    q_exps, do_exps, k_exps, v_exps = i8(t, hq), i8(t, hq), i8(t, hkv), i8(t, hkv)
    q_exps[0], do_exps[1], k_exps[2], v_exps[3] = EXP_MIN, EXP_MAX, EXP_MIN, EXP_MAX  # the range's ends
    pv = torch.randint(EXP_MIN, EXP_MAX + 1, (t, hkv), generator=g, dtype=torch.int32)
    pv[4], pv[5], pv[6] = EXP_MIN, EXP_MAX, 0
    special = torch.tensor([float("inf"), float("-inf"), -0.0, 1e-40, -3e38, 0.0])
    m, ro, delta = (torch.randn(hq, t, generator=g) * 2.0 ** torch.randint(-30, 30, (hq, t), generator=g)
                    for _ in range(3))
    m[0, :6], ro[0, 6:12], delta[0, 12:18] = special, special, special
    return q_exps, do_exps, pv, m, ro, delta, k_exps, v_exps


def _pow2(e: torch.Tensor) -> torch.Tensor:
    return torch.ldexp(torch.ones(e.shape), e.int())


@pytest.mark.parametrize("hq,hkv,sigma", [(2, 2, 4), (4, 2, 1), (2, 1, 27)])  # sigma - PV from -126 to 127
def test_decoders_return_what_the_builders_were_given(hq, hkv, sigma):
    t = 50  # rows 50..63 of each program are past the end
    q_exps, do_exps, pv, m, ro, delta, k_exps, v_exps = _inputs(t, hq, hkv, seed=hq + sigma)
    rec = query_records(*(x.to(DEVICE) for x in (q_exps, do_exps, pv, m, ro, delta)), sigma)
    krec = key_records(k_exps.to(DEVICE), v_exps.to(DEVICE))
    out = torch.empty((hq, 5, N), dtype=torch.float32, device=DEVICE)
    kout = torch.empty((hkv, 2, N), dtype=torch.float32, device=DEVICE)
    out_by_word = torch.empty_like(out)
    _query_kernel[(hq,)](rec, out, t, N=N, BY_WORD=False)
    _query_kernel[(hq,)](rec, out_by_word, t, N=N, BY_WORD=True)
    _key_kernel[(hkv,)](krec, kout, t, N=N)
    assert torch.equal(out_by_word, out), "the word-by-word reader differs"
    out, kout = out.cpu(), kout.cpu()
    group = hq // hkv
    bits = lambda x: x.contiguous().view(torch.int32)
    for h in range(hq):
        dof = _pow2(do_exps[:, h])
        qg = _pow2(q_exps[:, h])
        want = [m[h], (ro[h] * dof) * qg, delta[h] / dof, qg, _pow2(sigma - pv[:, h // group])]
        for f, w in enumerate(want):
            assert torch.equal(bits(out[h, f, :t]), bits(w)), f"head {h} field {f}"
        past = out[h, :, t:]
        assert torch.equal(past[0], torch.full((N - t,), float("inf"))), "m past the end: +inf"
        assert not past[1:3].any(), "rq and deltad past the end: 0"
        # factors past the end are 2^0, never 0: the dQ's masked -inf scores times them stay -inf
        assert torch.equal(past[3:], torch.ones(2, N - t)), "qg and rf past the end: 1"
    for h in range(hkv):
        assert torch.equal(kout[h, 0, :t], _pow2(k_exps[:, h])) and torch.equal(kout[h, 1, :t], _pow2(v_exps[:, h]))
    assert torch.equal(kout[:, :, t:], torch.ones(hkv, 2, N - t)), "keys past the end read kf = vf = 1"


def test_query_records_name_sigma_out_of_range():
    q_exps, do_exps, pv, m, ro, delta, _, _ = _inputs(20, 2, 2, seed=0)
    with pytest.raises(ValueError, match="^sigma: "):
        query_records(q_exps, do_exps, pv, m, ro, delta, 28)


def test_key_factors_are_exact_powers_of_two():
    t, hkv = 50, 3
    g = torch.Generator().manual_seed(7)
    k_exps, v_exps = (torch.randint(EXP_MIN, EXP_MAX + 1, (t, hkv), generator=g).to(torch.int8) for _ in range(2))
    k_exps[0], v_exps[0], k_exps[1], v_exps[1] = EXP_MIN, EXP_MAX, EXP_MAX, EXP_MIN
    krec = key_records(k_exps.to(DEVICE), v_exps.to(DEVICE))
    out = torch.empty((hkv, 2, N), dtype=torch.float32, device=DEVICE)
    _key_kernel[(hkv,)](krec, out, t, N=N)
    out = out.cpu()
    for h in range(hkv):
        assert torch.equal(out[h, 0, :t], _pow2(k_exps[:, h])) and torch.equal(out[h, 1, :t], _pow2(v_exps[:, h]))
    assert torch.equal(out[:, :, t:], torch.ones(hkv, 2, N - t)), "keys past the end read kf = vf = 1"


@pytest.mark.parametrize("block,k_lo", [(32, 0), (32, 64), (1, 32)])
def test_block_key_records_read_one_word_per_block(block, k_lo):
    """With exponents constant over each 32-key block (as the quantizers make them), the
    factors read once per block equal the per-key ones; keys past the tensor's end take
    their block's (callers mask them out), or 1 in blocks that start past it."""
    t = 150  # the last block is short; keys 150.. are past the end
    g = torch.Generator().manual_seed(block + k_lo)
    k_exps, v_exps = (torch.randint(EXP_MIN, EXP_MAX + 1, ((t + 31) // 32, 1), generator=g).to(torch.int8)
                      .repeat_interleave(32, 0)[:t] for _ in range(2))
    krec = key_records(k_exps.to(DEVICE), v_exps.to(DEVICE))
    out = torch.empty((2, 128), dtype=torch.float32, device=DEVICE)
    _block_key_kernel[(1,)](krec, out, t, k_lo, N=128, BLOCK=block)
    out = out.cpu()
    keys = torch.arange(k_lo, k_lo + 128)
    first = keys // block * block  # the word each key reads
    inside = first < t
    assert torch.equal(out[0, inside], _pow2(k_exps[first[inside], 0])), "kf"
    assert torch.equal(out[1, inside], _pow2(v_exps[first[inside], 0])), "vf"
    assert torch.equal(out[:, ~inside], torch.ones(2, int((~inside).sum()))), "blocks past the end read kf = vf = 1"
