"""Per-token records that the attention kernels read once per row or key instead of several
narrow vectors. A kernel loads a per-token vector in the layout of the MMA tile that uses
it: every thread loads each value for each row or column it holds, with its own 64-bit
address arithmetic: six such vectors per query step would make integer instructions a
quarter of the dK/dV kernel's. Here each query has one 16-byte record and each key one int32
word, tokens contiguous. The packed words hold each exponent e as the fp32 exponent field of
2^e (e + 127, 8 bits), at bits 23-30 or 15-22, so a decoder makes the fp32 factor with one
mask, or a shift and a mask, instead of a sign extension, a bias and a shift
(``_field_pow2``). Kernels that read keys per step read one word per 32-key scale block
(``block_key_records``), so the decoding is cheap there too. (Records of fp32 factors take
more bytes and registers: docs/PERFORMANCE.md.)
Builders and decoders are Triton (the builders one launch each, no host sync).
"""
import torch
import triton
import triton.language as tl

from .fp8 import maybe_masked_load, pow2
from .launch import cdiv, launch


_ROWS = 256  # tokens per program of the builders
# An exponent word whose two fields (bits 23 and 15) both hold 2^0: what a key or query past
# the document reads, so that every factor a kernel multiplies by is nonzero.
UNIT_FACTORS: tl.constexpr = tl.constexpr((127 << 23) | (127 << 15))


def query_records(q_exps: torch.Tensor, do_exps: torch.Tensor, pv: torch.Tensor, m: torch.Tensor, ro: torch.Tensor,
                  delta: torch.Tensor, sigma: int) -> torch.Tensor:
    """[Hq, Tq, 4] int32: one 16-byte record per (query head, row) holding the bits of
    (m, rq = ro 2^(edO + eQ), deltad = delta / 2^edO) and the biased exponent fields of 2^eQ
    and 2^(sigma - PV) at bits 23 and 15; ``query_fields`` decodes it. dO's factor 2^edO
    rides on ro and delta, and Q's 2^eQ on ro, because the backward's payloads need them
    nowhere else: ``(P^ rq)(dP vf - deltad)`` is ``((P^ ro)((dP 2^edO) vf - D)) 2^eQ`` bit
    for bit (exact powers of two, NUMERICS.md 4), two multiplies per pair and a per-query
    vector fewer in the dK/dV loop. One launch instead of ~12 torch ops, for the host time of
    an eager training call.
    q_exps, do_exps: [Tq, Hq] int8 in [EXP_MIN, EXP_MAX]; pv: [Tq, Hkv] int32 (a maximum of
    such exponents, or 0); m, ro, delta: [Hq, Tq] fp32; sigma in [0, 27], so that
    sigma - PV + 127 fits the 8-bit field (sigma = 0 with PV = 127 reads 2^-127 as 0, as the
    kernels' ``pow2`` does)."""
    check_sigma(sigma)
    total, heads_q = q_exps.shape
    heads_kv = pv.shape[1]
    rec = torch.empty((heads_q, total, 4), dtype=torch.int32, device=q_exps.device)
    if total and heads_q:
        launch(_query_records_kernel, (cdiv(total, _ROWS), heads_q),
            q_exps, do_exps, pv, m.contiguous(), ro.contiguous(), delta.contiguous(), rec, total, heads_q, heads_kv,
            SIGMA=sigma, GROUP=heads_q // heads_kv, N=_ROWS)
    return rec


def check_sigma(sigma: int) -> None:
    """The query records' bound on sigma (``query_records``)."""
    if not 0 <= sigma <= 27:
        raise ValueError(f"sigma: the query records hold 2^(sigma - PV) for PV in [-100, 127], so sigma must be in "
                         f"[0, 27], got {sigma}")


def key_records(k_exps: torch.Tensor, v_exps: torch.Tensor) -> torch.Tensor:
    """[Hkv, Tk] int32: the biased exponent fields of 2^eK (bits 23-30) and 2^eV (bits 15-22)
    per (KV head, key), tokens contiguous: a key tile reads one coalesced vector instead of
    two byte vectors strided by heads; ``packed_key_factors`` decodes it.
    k_exps, v_exps: [Tk, Hkv] int8."""
    total, heads_kv = k_exps.shape
    rec = torch.empty((heads_kv, total), dtype=torch.int32, device=k_exps.device)
    if total and heads_kv:
        launch(_key_records_kernel, (cdiv(total, _ROWS), heads_kv), k_exps, v_exps, rec, total, heads_kv,
               N=_ROWS)
    return rec


@triton.jit
def _query_records_kernel(p_qe, p_doe, p_pv, p_m, p_ro, p_delta, p_rec, total, heads_q, heads_kv,
                          SIGMA: tl.constexpr, GROUP: tl.constexpr, N: tl.constexpr):
    """Program (token chunk, query head): the records of N rows (``query_records``)."""
    h = tl.program_id(1).to(tl.int64)
    t = tl.program_id(0).to(tl.int64) * N + tl.arange(0, N)  # [N] rows
    m_t = t < total
    e_do = tl.load(p_doe + t * heads_q + h, mask=m_t, other=0).to(tl.int32)
    o_h = h * total + t  # [N] the row in [Hq, Tq] order
    store_query_records(p_rec, p_qe, p_pv, p_m, t, m_t, h, total, heads_q, heads_kv, tl.load(p_ro + o_h, mask=m_t),
                        e_do, tl.load(p_delta + o_h, mask=m_t), GROUP, SIGMA)


@triton.jit
def store_query_records(p_rec, p_qe, p_pv, p_m, t, m_t, h, total, heads_q, heads_kv, ro, e_do, delta,
                        GROUP: tl.constexpr, SIGMA: tl.constexpr):
    """Store ``query_records``' records of rows t [N] int64 (where m_t) of query head h (int64)
    from their ro, dO exponents e_do (int32, as stored) and delta [N] and the records' other
    inputs in memory (q_exps p_qe, pv p_pv, m p_m; GROUP query heads per KV head). p_qe None:
    Q's codes carry no exponents (the bf16 route's own bf16 Q), eQ = 0."""
    if p_qe is None:
        e_q = (t * 0).to(tl.int32)
    else:
        e_q = tl.load(p_qe + t * heads_q + h, mask=m_t, other=0).to(tl.int32)
    pv = tl.load(p_pv + t * heads_kv + h // GROUP, mask=m_t, other=0)
    o_h = h * total + t  # [N] the row in [Hq, Tq] order
    o_r = o_h * 4
    tl.store(p_rec + o_r, tl.load(p_m + o_h, mask=m_t).to(tl.int32, bitcast=True), mask=m_t)
    dof = pow2(e_do)  # exact products and a correctly rounded quotient: IEEE, as torch computes them
    tl.store(p_rec + o_r + 1, ((ro * dof) * pow2(e_q)).to(tl.int32, bitcast=True), mask=m_t)
    tl.store(p_rec + o_r + 2, tl.math.div_rn(delta, dof).to(tl.int32, bitcast=True), mask=m_t)
    tl.store(p_rec + o_r + 3, ((e_q + 127) << 23) | ((SIGMA - pv + 127) << 15), mask=m_t)


@triton.jit
def _key_records_kernel(p_ke, p_ve, p_rec, total, heads_kv, N: tl.constexpr):
    """Program (token chunk, KV head): the records of N keys (``key_records``)."""
    h = tl.program_id(1).to(tl.int64)
    t = tl.program_id(0).to(tl.int64) * N + tl.arange(0, N)  # [N] keys
    m_t = t < total
    e_k = tl.load(p_ke + t * heads_kv + h, mask=m_t, other=0).to(tl.int32)
    e_v = tl.load(p_ve + t * heads_kv + h, mask=m_t, other=0).to(tl.int32)
    o_h = h * total + t  # [N] the key in [Hkv, Tk] order
    tl.store(p_rec + o_h, ((e_k + 127) << 23) | ((e_v + 127) << 15), mask=m_t)


@triton.jit
def _field_pow2(word, SHIFT: tl.constexpr):
    """fp32 2^e from the biased exponent field e + 127 at bits [23 - SHIFT, 31 - SHIFT) of an
    int32 word: shifted into fp32's exponent field, everything else masked off."""
    return ((word << SHIFT) & 0x7F800000).to(tl.float32, bitcast=True)


@triton.jit
def packed_key_factors(p_krec, o_k, m_k, MASK: tl.constexpr):
    """(kf = 2^eK, vf = 2^eV) fp32 [N] of keys o_k from their records (``key_records``;
    p_krec at the document's first key of the head); MASK: mask the load with m_k (keys past
    it read 1, as eK = eV = 0)."""
    return record_factors(maybe_masked_load(p_krec + o_k.to(tl.int64), m_k, UNIT_FACTORS, MASK))


@triton.jit
def block_key_records(p_krec, k_lo, o_j, n_k, BLOCK: tl.constexpr, N: tl.constexpr):
    """[N] int32 ``key_records`` words of keys k_lo + o_j (o_j [N] = 0..N-1 in any order or
    layout; k_lo and N multiples of BLOCK, the keys' scale block, blocks starting at the
    document's first key), read once per block: every key of a block shares its exponents.
    Keys past a document's end take the word of the block they fall in (the document's last
    block, then the next document's), or eK = eV = 0 past n_k; callers mask those keys out.
    The compiler folds the per-key selection, so each thread holds N / BLOCK words instead of
    one per key it holds: the Gluon forward keeps its wgmma accumulators out of local memory
    and prefetches the next tile's words in 4 registers, and in the Gluon dK/dV a thread's two
    key rows share one word (so ``grad_scores``' vf rf is one value per query column).
    BLOCK = 1 (per-token exponents) or N not a multiple of BLOCK reads a word per key.
    ``record_factors`` decodes the words."""
    if BLOCK == 1 or N % BLOCK != 0:  # per-token exponents, or steps within a block: a word per key
        rec = tl.load(p_krec + k_lo + o_j, mask=k_lo + o_j < n_k, other=UNIT_FACTORS)
    else:
        rec = o_j * 0
        for b in tl.static_range(N // BLOCK):
            k = k_lo + b * BLOCK
            word = tl.load(p_krec + k, mask=k < n_k, other=UNIT_FACTORS)  # the block's record
            rec = tl.where(o_j // BLOCK == b, word, rec)
    return rec


@triton.jit
def record_factors(rec):
    """(kf = 2^eK, vf = 2^eV) fp32 of ``key_records`` words rec."""
    return _field_pow2(rec, 0), _field_pow2(rec, 8)


@triton.jit
def query_fields(p_rec, o_i, m_i, MASK: tl.constexpr):
    """(m, rq = ro 2^(edO + eQ), deltad = delta / 2^edO, qg = 2^eQ, rf = 2^(sigma - PV))
    fp32, each [N], of rows o_i from their records (``query_records``; p_rec at the document's first row
    of the head), one 16-byte load per row. With MASK, rows where m_i is false read m = +inf,
    rq = deltad = 0 and factors 2^0: no key is visible to them."""
    o_f = tl.arange(0, 4)
    o_r = o_i.to(tl.int64)[:, None] * 4 + o_f[None, :]  # [N, 4]
    past_end = tl.where(o_f == 0, 0x7F800000, tl.where(o_f == 3, UNIT_FACTORS, 0))[None, :]  # +inf's bits, 0, 0, 2^0
    return query_record_fields(maybe_masked_load(p_rec + o_r, m_i[:, None], past_end, MASK))


@triton.jit
def query_record_fields(rec):
    """``query_fields``'s five fields from rec [N, 4] int32, a row's record words in order."""
    # [N, 4] -> [N, 2, 2]: split takes the last axis, so (m, deltad) then (rq, exps)
    even, odd = tl.split(tl.reshape(rec, [rec.shape[0], 2, 2]))
    m_bits, delta_bits = tl.split(even)
    rq_bits, exps = tl.split(odd)
    return _decode_query(m_bits, rq_bits, delta_bits, exps)


@triton.jit
def query_fields_by_word(p_rec, o_i, m_i):
    """``query_fields`` (masked) with one 4-byte load per word: no [N, 4] tensor, so a Gluon
    kernel can call it with o_i in any layout."""
    p_row = p_rec + o_i.to(tl.int64) * 4  # [N]
    m_bits = tl.load(p_row, mask=m_i, other=0x7F800000)
    rq_bits = tl.load(p_row + 1, mask=m_i, other=0)
    delta_bits = tl.load(p_row + 2, mask=m_i, other=0)
    exps = tl.load(p_row + 3, mask=m_i, other=UNIT_FACTORS)
    return _decode_query(m_bits, rq_bits, delta_bits, exps)


@triton.jit
def _decode_query(m_bits, rq_bits, delta_bits, exps):
    """The fields of ``query_fields`` from a record's four int32 words."""
    f32 = tl.float32
    return (m_bits.to(f32, bitcast=True), rq_bits.to(f32, bitcast=True), delta_bits.to(f32, bitcast=True),
            _field_pow2(exps, 0), _field_pow2(exps, 8))
