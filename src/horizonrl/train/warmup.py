"""Critic warmup (Verlog): fit the critic to the initial policy before the actor moves.

Collect `warmup_batches` fixed-turn batches once; then for `warmup_iters` passes: re-score the values
with the current critic, recompute GAE, and update the critic alone on every batch.
"""

from __future__ import annotations

import torch

from horizonrl.algos.losses import explained_variance
from horizonrl.config import PPOConfig
from horizonrl.learner.update import LossFn, Stats, minibatch_updates
from horizonrl.train.batch import PPOBatch, estimate_advantages, refresh_values


def critic_warmup(batches: list[PPOBatch], critic, critic_opt, critic_loss: LossFn, ppo: PPOConfig, pad_id: int,
                  shuffle: torch.Generator) -> dict[str, float]:
    """Train the critic only; returns its loss statistics and its final explained variance."""
    stats = Stats()
    for _ in range(ppo.warmup_iters):
        for batch in batches:
            refresh_values(batch, critic, pad_id, ppo.micro_batch_budget)
            estimate_advantages(batch, ppo)
            minibatch_updates(batch.data, ppo.mini_batch_size, ppo.micro_batch_budget, 1, shuffle,
                              [(critic_opt, critic_loss, ppo.grad_clip, stats)])
    for batch in batches:
        refresh_values(batch, critic, pad_id, ppo.micro_batch_budget)
        estimate_advantages(batch, ppo)
    metrics = stats.means("train/critic/")
    metrics["train/critic/explained_variance"] = explained_variance(
        torch.cat([b.index.to_turns(b.data["values_old"]).flatten() for b in batches]),
        torch.cat([b.index.to_turns(b.data["returns"]).flatten() for b in batches]),
        torch.cat([b.index.mask.flatten() for b in batches]))
    return metrics
