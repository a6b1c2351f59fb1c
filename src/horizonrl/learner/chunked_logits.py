"""Log-probs of target tokens and entropies under softmax(lm_head(hidden) / temperature), computed
chunk by chunk of positions so that neither the forward nor the backward pass ever holds more than
one chunk's [chunk, vocab] tensors (two fp32 copies at most), whatever the number of positions (for a
152k vocabulary, the fp32 logits of 8k positions are 5 GB a copy).

With z = (h W^T + b) / temperature, p = softmax(z) and H = -sum_v p_v log p_v:

    logp          = z_target - logsumexp(z)
    d logp / dz   = onehot(target) - p
    d H / dz      = -p * (log p + H)

The backward pass recomputes each chunk's logits from the saved hidden states and weight.
"""

from __future__ import annotations

import torch
from torch import Tensor

LOGIT_CHUNK_TOKENS = 1024   # positions whose [chunk, vocab] logits exist at one time


def chunked_logp_entropy(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                         temperature: float = 1.0, chunk_tokens: int = LOGIT_CHUNK_TOKENS,
                         matmul_dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """(logp [N], entropy [N]) in fp32 for hidden states [N, H], lm_head weight [V, H] (and bias [V]),
    target ids [N]; differentiable in hidden, weight and bias.

    The logits matmul runs in `matmul_dtype` (bf16 under autocast; None: the weight's dtype), the
    softmax math in fp32, as autocast would run lm_head followed by log_softmax.
    """
    return _ChunkedLogpEntropy.apply(hidden, weight, bias, targets, temperature, chunk_tokens,
                                     matmul_dtype or weight.dtype)


def _log_probs(hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: float) -> Tensor:
    """log softmax((h W^T + b) / temperature) in fp32 for one chunk; weight and bias already in the matmul dtype."""
    logits = hidden.to(weight.dtype) @ weight.T
    if bias is not None:
        logits += bias
    return logits.float().div_(temperature).log_softmax(dim=-1)


def _logp_entropy(log_p: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    return log_p.gather(-1, targets[:, None]).squeeze(-1), -log_p.exp().mul_(log_p).sum(dim=-1)


def _grad_logits(log_p: Tensor, targets: Tensor, entropy: Tensor, grad_logp: Tensor, grad_entropy: Tensor,
                 temperature: float) -> Tensor:
    """dL/d logits = (g_logp * onehot(target) - p * (g_logp + g_entropy * (log p + H))) / temperature,
    computed in place in log_p."""
    p = log_p.exp()
    grad_z = log_p.add_(entropy[:, None]).mul_(grad_entropy[:, None]).add_(grad_logp[:, None]).mul_(p).neg_()
    grad_z.scatter_add_(-1, targets[:, None], grad_logp[:, None])
    return grad_z.div_(temperature)


class _ChunkedLogpEntropy(torch.autograd.Function):
    """Each chunk's [chunk, vocab] tensors are freed before the next chunk's logits exist."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_tokens, matmul_dtype):
        w = weight.to(matmul_dtype)
        b = None if bias is None else bias.to(matmul_dtype)
        logp = torch.empty(len(targets), dtype=torch.float32, device=hidden.device)
        entropy = torch.empty_like(logp)
        for begin in range(0, len(targets), chunk_tokens):
            chunk = slice(begin, begin + chunk_tokens)
            logp[chunk], entropy[chunk] = _logp_entropy(_log_probs(hidden[chunk], w, b, temperature), targets[chunk])
        ctx.save_for_backward(hidden, weight, bias, targets, entropy)
        ctx.temperature, ctx.chunk_tokens, ctx.matmul_dtype = temperature, chunk_tokens, matmul_dtype
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, bias, targets, entropy = ctx.saved_tensors
        w = weight.to(ctx.matmul_dtype)
        b = None if bias is None else bias.to(ctx.matmul_dtype)
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros_like(weight) if need_weight else None
        grad_bias = torch.zeros_like(bias) if need_bias else None
        for begin in range(0, len(targets), ctx.chunk_tokens):
            chunk = slice(begin, begin + ctx.chunk_tokens)
            grad_z = _grad_logits(_log_probs(hidden[chunk], w, b, ctx.temperature), targets[chunk], entropy[chunk],
                                  grad_logp[chunk], grad_entropy[chunk], ctx.temperature)
            grad_logits = grad_z.to(ctx.matmul_dtype)
            if need_hidden:
                grad_hidden[chunk] = grad_logits @ w
            if need_weight:
                grad_weight.add_(grad_logits.T @ hidden[chunk].to(ctx.matmul_dtype))
            if need_bias:
                grad_bias.add_(grad_z.sum(dim=0))
            del grad_z, grad_logits
        return grad_hidden, grad_weight, grad_bias, None, None, None, None
