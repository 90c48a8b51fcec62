"""flamia/kernels/records.py: what the builders pack, the Triton decoders give back exactly,
over the whole int8 exponent range, PV's range, every fp32 bit pattern class (+-inf, -0,
subnormals) and GQA; rows past a document's end read (+inf, 0, 0, 0, 0, 0). The key factor
records hold 2^eK and 2^eV exactly over the quantizers' exponent range, and keys past the end
read 1. On the CPU the decoders run on Triton's interpreter."""
import pytest
import torch
import triton
import triton.language as tl

from flamia.formats.scales import EXP_MAX, EXP_MIN
from flamia.kernels.records import (key_exponents, key_factor_records, key_factors, key_records, query_fields,
                                    query_records)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
N = 64  # rows per program


@triton.jit
def _query_kernel(p_rec, p_out, n, N: tl.constexpr):
    """Program h: the fields [6, N] of rows 0..N-1 of query head h (rows >= n masked)."""
    h = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, N)
    fields = query_fields(p_rec + h * n * 4, o, o < n, True)
    for f in tl.static_range(6):
        tl.store(p_out + (h * 6 + f) * N + o, fields[f].to(tl.int32, bitcast=True))


@triton.jit
def _key_kernel(p_krec, p_kout, n, N: tl.constexpr):
    """Program h: (eK, eV) [2, N] of keys 0..N-1 of KV head h (keys >= n masked)."""
    h = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, N)
    e_k, e_v = key_exponents(p_krec + h * n, o, o < n, True)
    tl.store(p_kout + (h * 2) * N + o, e_k)
    tl.store(p_kout + (h * 2 + 1) * N + o, e_v)


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
    i8 = lambda *s: torch.randint(-128, 128, s, generator=g).to(torch.int8)
    q_exps, do_exps, k_exps, v_exps = i8(t, hq), i8(t, hq), i8(t, hkv), i8(t, hkv)
    q_exps[0], do_exps[1], k_exps[2], v_exps[3] = -128, 127, -128, 127  # the range's ends
    pv = torch.randint(-128, 128, (t, hkv), generator=g, dtype=torch.int32)
    pv[4] = -128
    special = torch.tensor([float("inf"), float("-inf"), -0.0, 1e-40, -3e38, 0.0])
    m, ro, delta = (torch.randn(hq, t, generator=g) * 2.0 ** torch.randint(-30, 30, (hq, t), generator=g)
                    for _ in range(3))
    m[0, :6], ro[0, 6:12], delta[0, 12:18] = special, special, special
    return q_exps, do_exps, pv, m, ro, delta, k_exps, v_exps


@pytest.mark.parametrize("hq,hkv", [(2, 2), (4, 2)])
def test_decoders_return_what_the_builders_pack(hq, hkv):
    t = 50  # rows 50..63 of each program are past the end
    q_exps, do_exps, pv, m, ro, delta, k_exps, v_exps = _inputs(t, hq, hkv, seed=hq)
    rec = query_records(*(x.to(DEVICE) for x in (q_exps, do_exps, pv, m, ro, delta)))
    krec = key_records(k_exps.to(DEVICE), v_exps.to(DEVICE))
    out = torch.empty((hq, 6, N), dtype=torch.int32, device=DEVICE)
    kout = torch.empty((hkv, 2, N), dtype=torch.int32, device=DEVICE)
    _query_kernel[(hq,)](rec, out, t, N=N)
    _key_kernel[(hkv,)](krec, kout, t, N=N)
    out, kout = out.cpu(), kout.cpu()
    group = hq // hkv
    bits = lambda x: x.view(torch.int32)
    for h in range(hq):
        want = [bits(m[h]), bits(ro[h]), bits(delta[h]), q_exps[:, h].int(), do_exps[:, h].int(),
                pv[:, h // group]]
        for f, w in enumerate(want):
            assert torch.equal(out[h, f, :t], w), f"head {h} field {f}"
        past = out[h, :, t:]
        assert torch.equal(past[0], torch.full((N - t,), 0x7F800000, dtype=torch.int32)), "m past the end: +inf"
        assert not past[1:].any(), "ro, delta and the exponents past the end: 0"
    for h in range(hkv):
        assert torch.equal(kout[h, 0, :t], k_exps[:, h].int()) and torch.equal(kout[h, 1, :t], v_exps[:, h].int())
        assert not kout[h, :, t:].any()



def test_key_factors_are_exact_powers_of_two():
    t, hkv = 50, 3
    g = torch.Generator().manual_seed(7)
    k_exps, v_exps = (torch.randint(EXP_MIN, EXP_MAX + 1, (t, hkv), generator=g).to(torch.int8) for _ in range(2))
    k_exps[0], v_exps[0], k_exps[1], v_exps[1] = EXP_MIN, EXP_MAX, EXP_MAX, EXP_MIN
    kfr = key_factor_records(k_exps.to(DEVICE), v_exps.to(DEVICE))
    out = torch.empty((hkv, 2, N), dtype=torch.float32, device=DEVICE)
    _key_factor_kernel[(hkv,)](kfr, out, t, N=N)
    out = out.cpu()
    pow2 = lambda e: torch.ldexp(torch.ones(e.shape), e.int())
    for h in range(hkv):
        assert torch.equal(out[h, 0, :t], pow2(k_exps[:, h])) and torch.equal(out[h, 1, :t], pow2(v_exps[:, h]))
    assert torch.equal(out[:, :, t:], torch.ones(hkv, 2, N - t)), "keys past the end read kf = vf = 1"
