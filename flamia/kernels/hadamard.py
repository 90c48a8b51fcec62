"""The normalized Walsh-Hadamard rotation of a register tile's last axis, in the butterfly
order of ``flamia.formats.hadamard`` (one IEEE operation per step, so the bits match): the
quantizer rotates Q and K with it, the backward rotates dQ and dK back (the rotation is its
own inverse)."""
import triton
import triton.language as tl


@triton.jit
def _butterfly(b_x, DIST: tl.constexpr):
    """One Walsh-Hadamard stage on the last axis of b_x [U, D]: the pair (a, b) at distance
    DIST (a's index has bit DIST clear) becomes (a + b, a - b)."""
    U: tl.constexpr = b_x.shape[0]
    D: tl.constexpr = b_x.shape[1]
    # [U, D / (2 DIST), DIST, 2]: the pair axis last, where split/join work.
    b_y = tl.permute(tl.reshape(b_x, [U, D // (2 * DIST), 2, DIST]), [0, 1, 3, 2])
    b_a, b_b = tl.split(b_y)  # [U, D / (2 DIST), DIST]
    b_y = tl.permute(tl.join(b_a + b_b, b_a - b_b), [0, 1, 3, 2])
    return tl.reshape(b_y, [U, D])


@triton.jit
def rotate(b_x, inv_sqrt_d, STAGES: tl.constexpr):
    """b_x [U, D] fp32 times H_D / sqrt(D) (D = 2^STAGES, inv_sqrt_d = fp32(1/sqrt(D)));
    STAGES = 0 returns b_x unchanged."""
    if STAGES > 0:
        for s in tl.static_range(STAGES):
            b_x = _butterfly(b_x, 1 << s)
        b_x = b_x * inv_sqrt_d
    return b_x
