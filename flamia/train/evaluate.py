"""Evaluation: validation loss through the run's own and through exact attention, and
``single_step_cos``, the cosine between the run's attention gradients (dQ, dK, dV) and the
exact ones on the first layer of a fixed validation batch."""
import torch
import torch.nn.functional as F

from flamia.data import Batch

from .model import AttnFn, exact_attention, loss_of
from .state import Progress


@torch.no_grad()
def validation_loss(model, batches: list[Batch], attn: AttnFn) -> float:
    """Mean of ``loss_of`` over ``batches`` (nats per byte)."""
    return float(torch.stack([loss_of(model, b, attn) for b in batches]).mean())


def _attention_grads(attn: AttnFn, qkv, batch: Batch, d_out: torch.Tensor,
                     dtype: torch.dtype) -> torch.Tensor:
    """(dQ, dK, dV) of ``attn`` fed ``qkv`` in ``dtype``, flattened and concatenated, fp32."""
    leaves = [t.detach().float().requires_grad_() for t in qkv]
    out = attn(*(t.to(dtype) for t in leaves), batch)
    return torch.cat([g.flatten() for g in torch.autograd.grad(out, leaves, d_out.to(out.dtype))])


def single_step_cos(model, batch: Batch, own: AttnFn) -> float:
    """Cosine between the run's and exact attention gradients at the first layer: q, k, v and
    the upstream gradient dO come from the model itself on ``batch`` (through its own
    attention); own attention sees them in bf16, as in training, exact attention in fp32."""
    seen = []

    def capture(q, k, v, b):
        out = own(q, k, v, b)
        if not seen:
            seen.append(((q, k, v), out))
        return out

    loss = loss_of(model, batch, capture)
    qkv, out = seen[0]
    d_out = torch.autograd.grad(loss, out)[0]
    g_own = _attention_grads(own, qkv, batch, d_out, qkv[0].dtype).double()
    g_exact = _attention_grads(exact_attention, qkv, batch, d_out, torch.float32).double()
    return float(F.cosine_similarity(g_own, g_exact, dim=0))


def evaluate(model, val_batches: list[Batch], own: AttnFn, progress: Progress) -> dict:
    """One record: validation loss through own and exact attention, the mean training loss
    and pre-clipping gradient norm since the last evaluation (whose sums it resets), and
    single_step_cos. (The model has no dropout: training and evaluation modes compute the
    same.)"""
    record = {"step": progress.step,
              "val_loss_own": validation_loss(model, val_batches, own),
              "val_loss_exact": validation_loss(model, val_batches, exact_attention),
              "grad_norm": progress.gnorm_sum / max(1, progress.since_eval),
              "train_loss": progress.loss_sum / max(1, progress.since_eval),
              "single_step_cos": single_step_cos(model, val_batches[0], own)}
    progress.loss_sum = progress.gnorm_sum = 0.0
    progress.since_eval = 0
    return record
