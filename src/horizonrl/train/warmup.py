"""Critic warmup (Verlog): fit the critic to the initial policy before the actor moves.

Collect `critic.warmup_batches` fixed-turn batches once; then for `critic.warmup_iters` passes:
re-score the values with the current critic, recompute GAE, and update the critic alone on every batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from horizonrl.algos.losses import explained_variance
from horizonrl.learner.update import Stats, minibatch_updates
from horizonrl.train.batch import PPOBatch, estimate_advantages, refresh_values

if TYPE_CHECKING:
    from horizonrl.train.context import RunContext


def critic_warmup(ctx: RunContext, batches: list[PPOBatch]) -> dict[str, float]:
    """Train ctx.critic only; returns its loss statistics and its final explained variance."""
    cfg, optim, stats = ctx.cfg, ctx.cfg.optim, Stats()
    for _ in range(cfg.critic.warmup_iters):
        for batch in batches:
            refresh_values(batch, ctx.critic, ctx.pad_id, optim.micro_batch_budget)
            estimate_advantages(batch, cfg.ppo)
            minibatch_updates(batch.data, optim.mini_batch_size, optim.micro_batch_budget, 1, ctx.shuffle,
                              [(ctx.critic_opt, ctx.critic_loss, optim.grad_clip, stats)])
    for batch in batches:
        refresh_values(batch, ctx.critic, ctx.pad_id, optim.micro_batch_budget)
        estimate_advantages(batch, cfg.ppo)
    metrics = stats.means("train/critic/")
    metrics["train/critic/explained_variance"] = explained_variance(
        torch.cat([b.index.to_turns(b.data["values_old"]).flatten() for b in batches]),
        torch.cat([b.index.to_turns(b.data["returns"]).flatten() for b in batches]),
        torch.cat([b.index.mask.flatten() for b in batches]))
    return metrics
