"""Shared fixtures: seeded generators and packed random inputs.

Without CUDA the Triton kernels run on Triton's CPU interpreter: TRITON_INTERPRET is set
here, before any test module imports a kernel (Triton reads it when a kernel is decorated).
flamia itself is imported only when a fixture is used.
"""
import os
import tempfile

# pytest-xdist (the README's -n auto) runs a worker per core: each worker's torch and BLAS
# pools get that share of the cores (set before torch and numpy start them), so that the
# workers do not oversubscribe them.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
_THREADS = max(1, (os.cpu_count() or 1) // _WORKERS) if _WORKERS else 0
if _THREADS:
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, str(_THREADS))

import pytest  # noqa: E402
import torch  # noqa: E402

if _THREADS:
    torch.set_num_threads(_THREADS)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# torch.compile's caches do not key on a custom op's fake implementation, so graphs cached by a
# run of another checkout (other fake residuals) would replay here: every run starts empty.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="flamia-inductor-"))


@pytest.fixture
def generator() -> torch.Generator:
    """A CPU generator seeded with 0, fresh for every test."""
    return torch.Generator().manual_seed(0)


@pytest.fixture
def packed_batch():
    """Factory ``packed_batch(lengths, heads_q, heads_kv, head_dim, dtype=torch.bfloat16,
    outlier_channels=0, seed=0, device="cpu")`` -> ``flamia.workload.PackedInputs`` with
    q [T, Hq, D], k and v [T, Hkv, D], do [T, Hq, D] (random normal, drawn on the CPU from
    ``seed``), cu_seqlens int32 [num_docs + 1] and max_seqlen. ``outlier_channels``: that
    many channels per KV head of K and V are 20-100x larger."""
    from flamia.workload import make_packed_inputs

    def make(lengths, heads_q, heads_kv, head_dim, dtype=torch.bfloat16, outlier_channels=0, seed=0,
             device="cpu"):
        return make_packed_inputs(lengths, heads_q, heads_kv, head_dim, dtype, outlier_channels, seed, device)

    return make
