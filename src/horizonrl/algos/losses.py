"""PPO actor and critic losses, and the loss aggregation modes.

All per-token tensors are [B, T] with a 0/1 `mask` of the sampled tokens. Aggregation takes global
normalisers (`num_tokens`, `num_seqs` of the whole mini-batch) so that micro-batches summed with
gradient accumulation give exactly the full mini-batch loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from horizonrl.algos.kl import bounded_log_ratio, kl_estimate

LossAgg = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]


def aggregate(loss: Tensor, mask: Tensor, mode: LossAgg, num_tokens: float | None = None,
              num_seqs: float | None = None) -> Tensor:
    """Reduce a [B, T] per-token loss to a scalar.

        token-mean:           sum_{b,t} m*l / num_tokens                  (num_tokens = sum m)
        seq-mean-token-sum:   sum_b (sum_t m*l) / num_seqs                 (num_seqs = B)
        seq-mean-token-mean:  sum_b (sum_t m*l / sum_t m) / num_seqs

    Pass the mini-batch's num_tokens / num_seqs when `loss` is one micro-batch of it.
    """
    mask = mask.to(loss.dtype)
    masked = loss * mask
    if mode == "token-mean":
        denom = mask.sum() if num_tokens is None else num_tokens
        return masked.sum() / max(float(denom), 1.0)
    denom = loss.shape[0] if num_seqs is None else num_seqs
    if mode == "seq-mean-token-sum":
        return masked.sum() / max(float(denom), 1.0)
    if mode == "seq-mean-token-mean":
        per_seq = masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        return per_seq.sum() / max(float(denom), 1.0)
    raise ValueError(f"unknown loss aggregation {mode!r}")


def ppo_policy_loss(logp: Tensor, logp_old: Tensor, adv: Tensor, clip_low: float = 0.2,
                    clip_high: float = 0.2, dual_clip: float | None = 3.0) -> tuple[Tensor, Tensor]:
    """Per-token clipped surrogate loss with optional dual clip.

        rho  = exp(clamp(logp - logp_old, -20, 20))
        L    = max(-A * rho, -A * clip(rho, 1 - clip_low, 1 + clip_high))
        L    = min(L, -A * dual_clip)          where A < 0 (dual clip, dual_clip > 1)

    The log-ratio bound (verl's; `bounded_log_ratio`, algos/kl.py) keeps rho finite, so loss and gradient
    stay finite where the policy moved far from pi_old (unbounded, exp overflows past log rho ~ 88.7 and
    inf * 0 makes the gradient NaN, even at A = 0). Beyond it rho has no gradient: above +20 the clip
    (A > 0) or the dual clip (A < 0) holds the loss anyway (without a dual clip, a token with A < 0 there
    contributes -A * e^20); below -20 the gradient lost is under |A| * e^-20 ~ 2e-9 |A|.

    Returns (loss, clipped) per token; `clipped` is 1.0 where the clipped term was the larger one.
    """
    ratio = torch.exp(bounded_log_ratio(logp, logp_old))
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * dual_clip), loss)
    return loss, (clipped > unclipped).to(loss.dtype)


def tis_weights(logp_old: Tensor, logp_engine: Tensor, cap: float, mode: str = "truncate") -> Tensor:
    """Importance weights of tokens the engine sampled for the learner's policy, rho = exp(logp_old - logp_engine):

        truncate   w = min(rho, cap)
        mask       w = rho where rho <= cap, else 0 (the token leaves the policy gradient; AReaL's filter)

    logp_old: the learner's log-prob before the update; logp_engine: the engine's, as sampled. Data,
    not a function of the parameters: no gradient flows through w. So rho needs no log-ratio bound: one
    that overflows to inf is truncated to cap or masked to 0, and exp(-large) is 0."""
    rho = torch.exp(logp_old - logp_engine)
    return (rho.clamp(max=cap) if mode == "truncate" else torch.where(rho <= cap, rho, 0.0)).detach()


def entropy_coef_at(entropy_coef: float, decay: str, iteration: int, iterations: int) -> float:
    """The entropy bonus of update `iteration` (1..iterations): constant, or linear decay

        c_i = entropy_coef * (1 - (i - 1) / iterations)

    (c_1 = entropy_coef, c_iterations = entropy_coef / iterations): exploration early, a sharper policy
    (its greedy actions closer to its sampled ones) late; CleanRL decays its learning rate so."""
    if decay == "constant":
        return entropy_coef
    if decay == "linear":
        return entropy_coef * (1 - (iteration - 1) / iterations)
    raise ValueError(f"actor.entropy_decay must be constant or linear, got {decay!r}")


def approx_kl(logp: Tensor, logp_old: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(pi_old || pi): (rho - 1) - log rho, rho = exp(logp - logp_old), that is
    kl_estimate(logp_old, logp, "k3"), with its log-ratio bound."""
    return kl_estimate(logp_old, logp, "k3")


def value_loss(values: Tensor, values_old: Tensor, returns: Tensor, clip: float | None = 0.5) -> tuple[Tensor, Tensor]:
    """Per-token clipped value loss.

        V_clip = clamp(V, V_old - clip, V_old + clip)
        L      = 0.5 * max((V - R)^2, (V_clip - R)^2)

    Returns (loss, clipped) per token; `clipped` is 1.0 where the clipped term was the larger one. V itself is
    clamped, as verl's compute_value_loss does: V_old + clamp(V - V_old) is not always V in fp32 inside the
    range, and the rounding then counted tokens as clipped.
    """
    unclipped = (values - returns) ** 2
    if clip is None:
        return 0.5 * unclipped, torch.zeros_like(unclipped)
    v_clipped = torch.clamp(values, values_old - clip, values_old + clip)
    clipped = (v_clipped - returns) ** 2
    return 0.5 * torch.maximum(unclipped, clipped), (clipped > unclipped).to(values.dtype)


def first_token_weights(mask: Tensor, first_token_weight: float) -> Tensor:
    """Per-token weights for the value loss: `first_token_weight` on the first token of each run of
    sampled tokens (the value of a turn's prompt, V_{i,0}), 1 elsewhere, 0 where mask is 0."""
    mask = mask.to(torch.float32)
    previous = torch.nn.functional.pad(mask[:, :-1], (1, 0))
    first = mask * (1.0 - previous)
    return mask + (first_token_weight - 1.0) * first


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor,
                       total: Callable[[list[float]], list[float]] = list) -> float:
    """1 - Var[R - V] / Var[R] over masked tokens (1 is a perfect critic, 0 a constant one; NaN for fewer
    than two tokens or constant returns), population variances in two passes (means, then squared
    deviations). `total` turns local sums into the sums over every process holding part of the tokens
    (`Ranks.sum`; identity: this process alone), so only five numbers per process cross."""
    m = mask.bool()
    r, v = returns[m].float(), values[m].float()
    d = r - v
    n, r_sum, d_sum = total([float(r.numel()), float(r.sum()), float(d.sum())])
    r_mean, d_mean = r_sum / max(n, 1.0), d_sum / max(n, 1.0)
    r_dev, d_dev = total([float((r - r_mean).square().sum()), float((d - d_mean).square().sum())])
    if n < 2 or r_dev <= 0:
        return float("nan")
    return 1.0 - d_dev / r_dev
