"""Critic warmup (Verlog): fit the critic to the initial policy before the actor moves.

Collect `critic.warmup_batches` fixed-turn batches once; then for `critic.warmup_iters` passes:
re-score the values with the current critic, recompute GAE, and update the critic alone on every batch.
It runs before the run's first checkpoint, which it ends (iteration 0): a stop signal ends it between two
batches (StopSignals.check, on every rank), with nothing saved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from horizonrl.algos.losses import explained_variance
from horizonrl.learner.update import Stats, minibatch_updates
from horizonrl.train.batch import PPOBatch, estimate_advantages, sampled_tokens, score_batch

if TYPE_CHECKING:
    from horizonrl.train.context import RunContext


def critic_warmup(ctx: RunContext, batches: list[PPOBatch], fitted: Callable[[], object] = lambda: None
                  ) -> dict[str, float]:
    """Train ctx.critic only, inside `ctx.checkpointer.signals.within(...)` (checked before every batch of every
    pass); `fitted()` after every batch of every pass (the progress bar's step). Returns its loss statistics and
    its final explained variance (over every rank's tokens)."""
    cfg, optim, stats = ctx.cfg, ctx.cfg.optim, Stats()
    for _ in range(cfg.critic.warmup_iters):
        for batch in batches:
            ctx.checkpointer.signals.check()
            score_batch(batch, ctx.pad_id, ctx.micro_batch_budget, critic=ctx.critic, ranks=ctx.ranks)
            estimate_advantages(batch, cfg.ppo, ctx.ranks)
            minibatch_updates(batch.data, optim.mini_batch_size, ctx.micro_batch_budget, 1, ctx.shuffle,
                              [(ctx.critic_opt, ctx.critic_loss, optim.grad_clip, stats)], ctx.ranks)
            fitted()
    for batch in batches:
        score_batch(batch, ctx.pad_id, ctx.micro_batch_budget, critic=ctx.critic, ranks=ctx.ranks)
        estimate_advantages(batch, cfg.ppo, ctx.ranks)
    metrics = stats.means("train/critic/")
    values, returns = (sampled_tokens(batches, key) for key in ("values_old", "returns"))
    metrics["train/critic/explained_variance"] = explained_variance(values, returns, torch.ones_like(values),
                                                                    total=ctx.ranks.sum)
    return metrics
