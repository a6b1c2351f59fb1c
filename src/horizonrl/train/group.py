"""The critic-free group family, one iteration top to bottom:

    collect     group.n_tasks tasks x group.group_size whole episodes, the episodes of a task on one seed
    score       rows scored by the actor and the reference where a term reads them (phases.needed_scores)
    advantages  the episode's outcome reward against its group (GRPO, Dr.GRPO, RLOO, REINFORCE++:
                algos/group.py) on every sampled token of the episode; GiGPO adds each turn's discounted return
                normalised among the group's turns that start in the same env state (algos/gigpo.py); RAE puts
                it against the moving baseline of its game and seat instead (algos/rae.py)
    update      the actor's clipped surrogate (actor.kl_loss_coef puts a KL to the reference in the loss)
    sync        the engine samples from the updated actor; the served-policy check (assembly/sync_check.py); a
                pool of past snapshots (selfplay.pool_size) takes one and draws the next batch's opponent
    record      metrics.jsonl (and the other sinks), two sample episodes in trajectories.jsonl

What it simplifies: an episode's advantage is one number on all of its tokens (GiGPO's, one a turn); there is no
per-token reward, hence no KL in the reward; episodes an env error or a failed agent closed leave their group.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from horizonrl.algos.gigpo import anchor_group_sizes, gigpo_advantages
from horizonrl.algos.group import broadcast_to_tokens, group_advantages
from horizonrl.algos.rae import RoleBaselines
from horizonrl.config import GiGPOConfig
from horizonrl.learner.distributed import LOCAL, Ranks
from horizonrl.learner.update import Stats, UpdateStep, minibatch_updates
from horizonrl.records import Episode
from horizonrl.train import phases
from horizonrl.train.batch import PPOBatch, kept_episodes
from horizonrl.assembly.context import RunContext


def group_iteration(ctx: RunContext, i: int) -> phases.Iteration:
    """A critic-free group estimator (cfg.algorithm) on whole episodes; returns its record and batch.

    Episodes closed by an env error or a failed agent are left out of their group; a rank left with none
    is an error on every rank (`kept_episodes`). There is no KL-in-reward term (there
    is no per-token reward to put it in); `actor.kl_loss_coef` puts the KL in the actor loss instead."""
    cfg, optim = ctx.cfg, ctx.cfg.optim
    clock = phases.Stopwatch()
    episodes = ctx.collector.collect()                         # n_tasks x group_size whole episodes
    kept = kept_episodes(episodes, ctx.ranks)                  # a batch with none to train on is an error
    ctx.sync_check.start(kept, ctx.engine, ctx.actor)           # the first batch: probe rows, gap on equal weights
    ctx.engine.sleep()                                          # a colocated engine frees memory for the update
    clock.lap("rollout")
    batch = phases.score(ctx, kept, critic=None)                # logp_old, logp_ref per token where read
    step_stats = {}
    if cfg.algorithm_spec.step_credit:                          # + step advantage from turns in the same state
        step_stats = gigpo_advantages_to_tokens(batch, cfg.gigpo, ctx.ranks)
    elif cfg.algorithm_spec.role_baseline:                      # outcome reward -> against its role's baseline
        step_stats = rae_advantages_to_tokens(batch, ctx.role_baselines, cfg.rae.per_seat, ctx.ranks)
    else:                                                       # outcome reward -> group advantage per token
        group_advantages_to_tokens(batch, cfg.algorithm_spec.estimator, ctx.ranks)
    clock.lap("score")
    actor_stats = Stats()
    minibatch_updates(batch.rows, optim.mini_batch_size, ctx.micro_batch_budget, optim.epochs, ctx.shuffle,
                      [UpdateStep(ctx.actor_opt, ctx.actor_loss(i), optim.grad_clip, actor_stats)], ctx.ranks)
    probe = phases.sync_engine(ctx)
    step_stats.update(ctx.opponent.after_update(i))             # a pool of snapshots: the next batch's opponent
    clock.lap("update")
    outcome_sum, n_kept = ctx.ranks.sum([sum(e.outcome_reward for e in kept), len(kept)])
    outcome = outcome_sum / max(n_kept, 1)
    return phases.iteration_record(ctx, i, cfg.algorithm, episodes, batch, clock.laps,
                                   {**actor_stats.means("train/actor/"),
                                    "train/actor/entropy_coef": ctx.entropy_coef(i),
                                    "train/outcome_reward_mean": outcome, **step_stats, **probe})


def group_advantages_to_tokens(batch: PPOBatch, estimator: str, ranks: Ranks = LOCAL) -> None:
    """Outcome advantages of whole episodes (`group_advantages` over their `outcome_reward`, grouped by
    `group_id`, over every rank's episodes: a group lives on one rank, REINFORCE++ whitens over the
    whole batch), broadcast over every sampled token of each episode's rows, stored in the batch's rows."""
    def against_groups(rewards: torch.Tensor, group_ids: list) -> torch.Tensor:
        groups = {g: i for i, g in enumerate(dict.fromkeys(group_ids))}
        return group_advantages(rewards, torch.tensor([groups[g] for g in group_ids], dtype=torch.long,
                                                      device=rewards.device), estimator)
    outcome_advantages_to_tokens(batch, [e.group_id for e in batch.episodes], against_groups, ranks)


def rae_advantages_to_tokens(batch: PPOBatch, baselines: RoleBaselines, per_seat: bool,
                             ranks: Ranks = LOCAL) -> dict[str, float]:
    """RAE's advantage of whole episodes (`RoleBaselines.advantages` over every rank's episodes, each rank moving
    the same baselines) on every sampled token of each episode's rows; returns each role's baseline after it.
    A role is the episode's task and, with `per_seat`, its seat (`<task>/seat<s>`; an episode without seats is
    its task's)."""
    def role(episode: Episode) -> str:
        seat = episode.turns[0].seat
        return episode.task if seat is None or not per_seat else f"{episode.task}/seat{seat}"
    outcome_advantages_to_tokens(batch, [role(e) for e in batch.episodes], baselines.advantages, ranks)
    return {f"rae/baseline/{name}": value for name, value in baselines.values.items()}


def outcome_advantages_to_tokens(batch: PPOBatch, keys: list, advantage_fn: Callable, ranks: Ranks = LOCAL) -> None:
    """`advantage_fn(rewards, keys)` of every rank's episodes (their `outcome_reward`, each with its key in `keys`),
    this rank's share broadcast over every sampled token of each episode's rows and stored in the batch's rows,
    with the outcome reward as the return."""
    device = batch.rows.loss_mask.device
    shares = ranks.gather([(e.outcome_reward, key) for e, key in zip(batch.episodes, keys, strict=True)])
    everyone = [pair for share in shares for pair in share]
    rewards = torch.tensor([r for r, _ in everyone], dtype=torch.float32, device=device)
    mine = slice(sum(len(share) for share in shares[:ranks.rank]), None)
    advantages = advantage_fn(rewards, [key for _, key in everyone])[mine][:len(batch.episodes)]
    rewards = rewards[mine][:len(batch.episodes)]
    row_episode = torch.zeros(len(batch.samples.input_ids), dtype=torch.long, device=device)
    segment = 0
    for episode_index, episode in enumerate(batch.episodes):       # segments are in episode order
        for _ in episode.turns:
            row_episode[batch.samples.segments[segment].row] = episode_index
            segment += 1
    mask = batch.rows.loss_mask
    batch.rows = dataclasses.replace(batch.rows, advantages=broadcast_to_tokens(advantages, row_episode, mask),
                                     returns=broadcast_to_tokens(rewards, row_episode, mask))


def gigpo_advantages_to_tokens(batch: PPOBatch, gigpo: GiGPOConfig, ranks: Ranks = LOCAL) -> dict[str, float]:
    """GiGPO's advantage of each turn (`gigpo_advantages`: the episode's outcome reward normalised in its
    group, plus the turn's discounted return normalised over its anchor group, the group's turns from the
    same env state) on every sampled token of the turn, stored in the batch's rows with the outcome reward as the
    return. A group and its anchor groups live on one rank, so this is local; the anchor statistics
    returned cover every rank."""
    device = batch.rows.loss_mask.device
    groups: dict[str | None, int] = {}
    episode_group = [groups.setdefault(e.group_id, len(groups)) for e in batch.episodes]
    turns = [(n, t) for n, e in enumerate(batch.episodes) for t in e.turns]     # in the segments' order
    if any(t.state_key is None for _, t in turns):
        raise ValueError("gigpo needs every turn's state_key (TextEnv.state_key()); some turns have none")
    step_episode = [n for n, _ in turns]
    step_state = [t.state_key for _, t in turns]
    rewards = torch.tensor([e.outcome_reward for e in batch.episodes], dtype=torch.float32, device=device)
    advantages = gigpo_advantages(rewards, torch.tensor(episode_group, dtype=torch.long, device=device),
                                  torch.tensor([t.reward for _, t in turns], dtype=torch.float32, device=device),
                                  torch.tensor(step_episode, dtype=torch.long, device=device), step_state,
                                  gigpo.gamma, gigpo.step_weight, gigpo.norm)
    shape, index = batch.rows.input_ids.shape, batch.index
    batch.rows = dataclasses.replace(batch.rows, advantages=index.to_rows(advantages[:, None] * index.mask, shape),
                                     returns=index.to_rows(rewards[step_episode][:, None] * index.mask, shape))
    sizes = anchor_group_sizes(episode_group, step_episode, step_state)
    size_sum, steps, anchored = ranks.sum([sum(sizes), len(sizes), sum(size > 1 for size in sizes)])
    return {"gigpo/anchor_group_size_mean": size_sum / max(steps, 1),
            "gigpo/anchored_step_frac": anchored / max(steps, 1)}
