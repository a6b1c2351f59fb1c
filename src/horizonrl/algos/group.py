"""Critic-free outcome advantages over groups of rollouts of the same task (GRPO, Dr.GRPO, RLOO,
REINFORCE++-baseline), and their broadcast to the tokens of each episode.

Layout: one scalar outcome reward r_i per episode i = 0..N-1; episodes of the same task and seed share
a group id g(i). For a group G with n = |G| members:

    mean_G = (1/n) sum_{j in G} r_j
    std_G  = sqrt( (1/(n-1)) sum_{j in G} (r_j - mean_G)^2 )      (unbiased, Bessel-corrected)

A group of size 1 carries no relative information: every estimator gives its member advantage 0.
A constant group (all rewards equal) also gets exactly 0, even where float rounding would leave
r_i - mean_G a tiny non-zero number (which GRPO would amplify by dividing by std_G + eps ~ eps).
"""

from __future__ import annotations

import torch
from torch import Tensor

ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp")


def group_advantages(rewards: Tensor, group_index: Tensor, estimator: str, eps: float = 1e-6) -> Tensor:
    """Outcome advantage of every episode relative to its group.

        grpo:          A_i = (r_i - mean_G) / (std_G + eps)
        dr_grpo:       A_i = r_i - mean_G                                   (Dr.GRPO: no std division)
        rloo:          A_i = r_i - (1/(n-1)) sum_{j in G, j != i} r_j = n/(n-1) * (r_i - mean_G)
        reinforce_pp:  c_i = r_i - mean_G,  A_i = (c_i - mean(c)) / (std(c) + eps)
                       with mean / std over the whole batch of N episodes (REINFORCE++-baseline)

    std is the unbiased (Bessel, n-1) standard deviation everywhere, as `torch.std` computes it by
    default; verl's `compute_grpo_outcome_advantage` and `masked_whiten` use the unbiased estimate
    too, so values match verl's on groups of size >= 2.

    Differences from verl, by design: (1) a group of size 1 gets 0 here (verl uses baseline 0 and
    std 1, i.e. keeps the raw reward); (2) REINFORCE++-baseline is whitened over the N episodes here,
    whereas verl whitens the token-broadcast tensor, weighting each episode by its token count.

    Args:
        rewards: [N] float outcome rewards (ints / bools are converted to float32).
        group_index: [N] integer group ids; any values, any order (groups may be interleaved).
        estimator: one of "grpo", "dr_grpo", "rloo", "reinforce_pp".
        eps: added to the std in the denominators.

    Returns:
        [N] advantages, same float dtype as `rewards`.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown group estimator {estimator!r}; valid: {', '.join(ESTIMATORS)}")
    if rewards.dim() != 1 or group_index.shape != rewards.shape:
        raise ValueError(f"rewards and group_index must both be [N]; got {tuple(rewards.shape)} "
                         f"and {tuple(group_index.shape)}")
    if group_index.dtype.is_floating_point or group_index.dtype == torch.bool:
        raise ValueError(f"group_index must be an integer tensor, got {group_index.dtype}")
    r = rewards.detach()
    if not r.dtype.is_floating_point:
        r = r.float()
    if r.numel() == 0:
        return r.clone()

    # compact group ids to 0..G-1
    _, group, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    n_groups = counts.numel()
    n = counts.to(r.dtype)[group]                                   # group size of each episode
    mean = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, group, r)[group] / n
    g_max = torch.full((n_groups,), -torch.inf, dtype=r.dtype, device=r.device)
    g_min = torch.full((n_groups,), torch.inf, dtype=r.dtype, device=r.device)
    g_max = g_max.scatter_reduce(0, group, r, reduce="amax")[group]
    g_min = g_min.scatter_reduce(0, group, r, reduce="amin")[group]
    flat = g_max == g_min                                           # constant group (incl. size 1)
    centred = torch.where(flat, torch.zeros_like(r), r - mean)      # r_i - mean_G

    if estimator == "dr_grpo":
        return centred
    if estimator == "rloo":
        return centred * n / (n - 1).clamp(min=1)
    if estimator == "grpo":
        sq = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, group, centred**2)
        std = (sq[group] / (n - 1).clamp(min=1)).sqrt()
        return centred / torch.where(flat, torch.ones_like(std), std + eps)   # 0, not 0/0, at eps = 0
    # reinforce_pp: whiten the group-centred rewards over the whole batch
    if centred.numel() < 2:
        return torch.zeros_like(centred)
    batch_mean = centred.mean()
    batch_std = centred.std(unbiased=True)
    return (centred - batch_mean) / (batch_std + eps)


def broadcast_to_tokens(advantages: Tensor, row_episode: Tensor, loss_mask: Tensor) -> Tensor:
    """Put each episode's outcome advantage on every sampled token of its rows.

        out[r, t] = advantages[row_episode[r]] * loss_mask[r, t]      (exactly 0 where mask is 0)

    Args:
        advantages: [N] per-episode advantages (from `group_advantages`).
        row_episode: [R] long, the episode (index into `advantages`) of each row; an episode may
            span several rows (one per turn).
        loss_mask: [R, T] 0/1 mask of the sampled (policy) tokens.

    Returns:
        [R, T] per-token advantages, dtype of `advantages`.
    """
    if advantages.dim() != 1 or row_episode.dim() != 1 or loss_mask.dim() != 2:
        raise ValueError("expected advantages [N], row_episode [R], loss_mask [R, T]")
    if row_episode.shape[0] != loss_mask.shape[0]:
        raise ValueError(f"row_episode has {row_episode.shape[0]} rows, loss_mask {loss_mask.shape[0]}")
    row_episode = row_episode.long()
    if row_episode.numel() and (row_episode.min() < 0 or row_episode.max() >= advantages.shape[0]):
        raise ValueError(f"row_episode must index 0..{advantages.shape[0] - 1}")
    per_row = advantages[row_episode][:, None].expand(loss_mask.shape)
    return torch.where(loss_mask.bool(), per_row, torch.zeros_like(per_row))
