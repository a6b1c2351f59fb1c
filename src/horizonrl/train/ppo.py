"""PPO with dual-discount GAE (Verlog), one iteration top to bottom:

    collect     rollout.n_env env streams x ppo.e_len turns (episodes cross iterations; a stream cut at the
                batch's end bootstraps from the critic's value of its next prompt)
    score       per-turn (or merged) rows: values_old by the critic; logp_old and logp_ref by the actor and the
                reference where a term reads them (phases.needed_scores)
    advantages  token rewards (the env's reward on each turn's last token, -ppo.kl_coef x KL on every token),
                then dual-discount GAE: (gamma_token, lambda_token) inside a turn, (gamma_step, lambda_step)
                from a turn to the next (algos/advantages.py)
    update      the critic's clipped value loss, then the actor's clipped surrogate, mini-batch by mini-batch
    sync        the engine samples from the updated actor; the served-policy check (assembly/sync_check.py)
    record      metrics.jsonl (and the other sinks), two sample episodes in trajectories.jsonl

Iteration 0 is the critic warmup (Verlog): `critic.warmup_batches` batches collected with the initial policy, the
critic alone fitted to them `critic.warmup_iters` times, before the actor moves.

What it simplifies: the value of a turn's state is read at its prompt's last token (column 0 of its row), and the
KL penalty is a per-token reward, not a constraint; one critic for every env of a multi-task run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from tqdm import tqdm

from horizonrl.algos.advantages import dual_discount_gae, whiten
from horizonrl.algos.kl import kl_in_reward
from horizonrl.algos.losses import explained_variance
from horizonrl.config import PPOConfig
from horizonrl.learner.distributed import LOCAL, Ranks
from horizonrl.learner.update import Stats, UpdateStep, minibatch_updates
from horizonrl.records import Episode
from horizonrl.report.metrics import episode_metrics
from horizonrl.train import phases
from horizonrl.train.batch import PPOBatch, played_episodes, sampled_tokens, score_batch
from horizonrl.assembly.context import RunContext


def ppo_iteration(ctx: RunContext, i: int) -> phases.Iteration:
    """PPO with dual-discount GAE on a fixed-turn batch; returns its record and batch."""
    cfg, optim = ctx.cfg, ctx.cfg.optim
    clock = phases.Stopwatch()
    episodes = collect_turns(ctx)                               # n_env streams x e_len turns
    ctx.sync_check.start(episodes, ctx.engine, ctx.actor)       # the first batch: probe rows, gap on equal weights
    ctx.engine.sleep()                                          # a colocated engine frees memory for the update
    clock.lap("rollout")
    batch = phases.score(ctx, episodes, ctx.critic)             # values_old (+ logp_old, logp_ref) per token
    estimate_advantages(batch, cfg.ppo, ctx.ranks)              # token rewards -> GAE -> advantages, returns
    clock.lap("score")
    actor_stats, critic_stats = Stats(), Stats()
    minibatch_updates(batch.rows, optim.mini_batch_size, ctx.micro_batch_budget, optim.epochs, ctx.shuffle,
                      [UpdateStep(ctx.critic_opt, ctx.critic_loss, optim.grad_clip, critic_stats),
                       UpdateStep(ctx.actor_opt, ctx.actor_loss(i), optim.grad_clip, actor_stats)], ctx.ranks)
    probe = phases.sync_engine(ctx)
    clock.lap("update")
    return phases.iteration_record(ctx, i, cfg.algorithm, episodes, batch, clock.laps,
                                   {**actor_stats.means("train/actor/"), **critic_stats.means("train/critic/"),
                                    **probe, "train/actor/entropy_coef": ctx.entropy_coef(i)})


def critic_warmup_iteration(ctx: RunContext, progress: bool = False) -> phases.Iteration:
    """Iteration 0 of ppo: `critic.warmup_batches` batches collected with the initial policy, then the
    critic alone fitted to them (`critic_warmup`); returns its record and last batch. A stop signal ends it between
    two batches, before the first checkpoint (StoppedBeforeCheckpoint). `progress`: a second bar, under the
    run's (which stays at 0 meanwhile), counts the batches collected, then those fitted (warmup_iters passes)."""
    clock = phases.Stopwatch()
    batches, errors = [], 0
    signals, critic = ctx.checkpointer.signals, ctx.cfg.critic
    with signals.within("the critic warmup", ctx.run_dir, ctx.ranks), \
            tqdm(total=critic.warmup_batches * (1 + critic.warmup_iters), desc="critic warmup: collect",
                 unit="batch", disable=not progress, position=1, leave=False, dynamic_ncols=True) as bar:
        for _ in range(critic.warmup_batches):
            signals.check()
            # values: critic_warmup's
            batches.append(phases.score(ctx, collect_turns(ctx), critic=None, updates_actor=False))
            errors += len(ctx.collector.errors)
            bar.update()
        bar.set_description("critic warmup: fit")
        stats = critic_warmup(ctx, batches, fitted=bar.update)
    clock.lap("warmup")
    record = {"iteration": 0, "phase": "critic_warmup", "env/errors": int(ctx.ranks.sum([errors])[0]),
              **episode_metrics([e for b in batches for e in b.episodes], ctx.ranks), **stats, **clock.laps}
    return phases.Iteration(record, batches[-1])


def collect_turns(ctx: RunContext) -> list[Episode]:
    """This rank's share of a fixed-turn batch (n_env streams x e_len turns); when some rank played no turn, an
    error on every rank (`played_episodes`)."""
    n_turns = len(ctx.ranks.share(ctx.cfg.rollout.n_env)) * ctx.cfg.ppo.e_len
    return played_episodes(ctx.collector.collect(), n_turns, ctx.collector.errors, ctx.ranks)


def estimate_advantages(batch: PPOBatch, ppo: PPOConfig, ranks: Ranks = LOCAL) -> None:
    """Token rewards (env reward on each turn's last token, -kl_coef * KL on every token: with kl_coef 0,
    the batch needs no logp_old nor logp_ref) and dual-discount GAE in the turn layout; advantages and
    returns stored back in the row layout. Each rank's streams are whole, so GAE is local; whitening uses
    every rank's tokens."""
    segments, index, data = batch.samples.segments, batch.index, batch.rows
    device = index.mask.device
    token_rewards = (kl_in_reward(index.to_turns(data.logp_old), index.to_turns(data.logp_ref), index.mask,
                                  ppo.kl_coef, ppo.kl_estimator) if ppo.kl_coef else torch.zeros_like(index.mask))
    last = index.mask.sum(dim=1).long() - 1
    token_rewards[torch.arange(len(segments), device=device), last] += torch.tensor(
        [s.reward for s in segments], device=device)
    bootstrap = torch.tensor([s.bootstrap for s in segments], device=device)
    padded = torch.cat([batch.bootstrap_values, torch.zeros(1, device=device)])  # index -1 -> 0.0
    advantages, returns = dual_discount_gae(
        token_rewards, index.to_turns(data.values_old), index.mask,
        episode_end=torch.tensor([s.episode_end for s in segments], device=device),
        next_row=torch.tensor([s.next_segment for s in segments], device=device),
        bootstrap_value=padded[bootstrap],
        gamma_step=ppo.gamma_step, lambda_step=ppo.lambda_step,
        gamma_token=ppo.gamma_token, lambda_token=ppo.lambda_token)
    if ppo.whiten_advantages:
        advantages = whiten(advantages, index.mask, total=ranks.sum_tensor)
    shape = data.input_ids.shape
    batch.rows = dataclasses.replace(data, advantages=index.to_rows(advantages, shape),
                                     returns=index.to_rows(returns, shape))


def critic_warmup(ctx: RunContext, batches: list[PPOBatch], fitted: Callable[[], object] = lambda: None
                  ) -> dict[str, float]:
    """Train ctx.critic only, inside `ctx.checkpointer.signals.within(...)` (checked before every batch of every
    pass); `fitted()` after every batch of every pass (the progress bar's step). Returns its loss statistics and
    its final explained variance (over every rank's tokens)."""
    cfg, optim, stats = ctx.cfg, ctx.cfg.optim, Stats()
    for _ in range(cfg.critic.warmup_iters):
        for batch in batches:
            ctx.checkpointer.signals.check()
            score_batch(batch, ctx.pad_id, ctx.micro_batch_budget, critic=ctx.critic, ranks=ctx.ranks,
                        sharing=ctx.sharing)
            estimate_advantages(batch, cfg.ppo, ctx.ranks)
            minibatch_updates(batch.rows, optim.mini_batch_size, ctx.micro_batch_budget, 1, ctx.shuffle,
                              [UpdateStep(ctx.critic_opt, ctx.critic_loss, optim.grad_clip, stats)], ctx.ranks)
            fitted()
    for batch in batches:
        score_batch(batch, ctx.pad_id, ctx.micro_batch_budget, critic=ctx.critic, ranks=ctx.ranks, sharing=ctx.sharing)
        estimate_advantages(batch, cfg.ppo, ctx.ranks)
    metrics = stats.means("train/critic/")
    values, returns = (sampled_tokens(batches, key) for key in ("values_old", "returns"))
    metrics["train/critic/explained_variance"] = explained_variance(values, returns, torch.ones_like(values),
                                                                    total=ctx.ranks.sum)
    return metrics
