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
from flamia.kernels.records import (key_factor_records, key_factors, key_records, packed_key_factors, query_fields,
                                    query_records)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
N = 64  # rows per program


@triton.jit
def _query_kernel(p_rec, p_out, n, N: tl.constexpr):
    """Program h: the fields [5, N] of rows 0..N-1 of query head h (rows >= n masked)."""
    h = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, N)
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
def _key_factor_kernel(p_kfr, p_out, n, N: tl.constexpr):
    """Program h: (kf, vf) [2, N] of keys 0..N-1 of KV head h (keys >= n masked)."""
    h = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, N)
    kf, vf = key_factors(p_kfr + h * n * 2, o, o < n, True)
    tl.store(p_out + (h * 2) * N + o, kf)
    tl.store(p_out + (h * 2 + 1) * N + o, vf)


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
    _query_kernel[(hq,)](rec, out, t, N=N)
    _key_kernel[(hkv,)](krec, kout, t, N=N)
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
        assert not past[1:].any(), "rq, deltad and the factors past the end: 0"
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
    kfr = key_factor_records(k_exps.to(DEVICE), v_exps.to(DEVICE))
    out = torch.empty((hkv, 2, N), dtype=torch.float32, device=DEVICE)
    _key_factor_kernel[(hkv,)](kfr, out, t, N=N)
    out = out.cpu()
    for h in range(hkv):
        assert torch.equal(out[h, 0, :t], _pow2(k_exps[:, h])) and torch.equal(out[h, 1, :t], _pow2(v_exps[:, h]))
    assert torch.equal(out[:, :, t:], torch.ones(hkv, 2, N - t)), "keys past the end read kf = vf = 1"
