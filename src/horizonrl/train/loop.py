"""The training loop: one outer loop, one iteration function per algorithm family.

    ppo_iteration     collect n_env x e_len turns -> per-turn rows scored by actor, reference, critic
                      -> token rewards (env reward on the last token, -kl_coef * KL on every token)
                      -> dual-discount GAE -> update critic and actor -> sync weights to the engine
    group_iteration   collect n_tasks x group_size whole episodes -> outcome reward per episode
                      -> rows scored by actor and reference -> group advantage on every sampled token
                      -> update actor -> sync weights to the engine          (grpo, dr_grpo, rloo, reinforce_pp)

Iteration 0 of a ppo run is the critic warmup (`critic_warmup_iteration`). Every iteration's record
goes to each metrics sink (metrics.jsonl always) and two sample episodes to trajectories.jsonl; the
run ends by writing report.html. Every `save_every` iterations, after the last one and when a
SIGINT/SIGTERM asks the run to stop, the whole training state is saved in checkpoints/
(train/checkpoint.py), from which `train(..., resume=RUN)` continues exactly.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import torch
from tqdm import tqdm

from horizonrl.config import TrainConfig
from horizonrl.envs.pool import open_envs
from horizonrl.learner.update import Stats, minibatch_updates
from horizonrl.records import Episode
from horizonrl.report.html import write_report
from horizonrl.report.metrics import episode_metrics
from horizonrl.report.sinks import check_sinks
from horizonrl.report.trajectories import trajectory_records, write_trajectories
from horizonrl.train.batch import PPOBatch, batch_metrics, estimate_advantages, group_advantages_to_tokens, prepare
from horizonrl.train.checkpoint import StopSignals, TrainingStopped, prepare_resume, save_checkpoint
from horizonrl.train.context import RunContext, start_run
from horizonrl.train.warmup import critic_warmup


def train(cfg: TrainConfig, progress: bool = True, resume: Path | None = None) -> Path:
    """Run a whole training job; returns the run folder runs/<name>-<time>/, report.html written last.

    `resume`: continue that run folder (`cfg`: its config, see checkpoint.resume_config) from its last
    checkpoint. A SIGINT or SIGTERM stops the run at the next iteration boundary with a checkpoint, and
    TrainingStopped is raised once report.html is written."""
    check_sinks(cfg.report_to)
    point = prepare_resume(resume, cfg) if resume is not None else None
    torch.manual_seed(cfg.seed)
    envs = [] if cfg.task is not None else open_envs(cfg.env.ids, cfg.env.kwargs, cfg.rollout.n_env, cfg.env.workers,
                                                     cfg.env.timeout_s)
    try:
        with StopSignals() as signals:
            ctx = start_run(cfg, envs, signals, point)
            with ctx.metrics, contextlib.closing(ctx.engine):
                run_iterations(ctx, progress)
            save_checkpoint(ctx.run_dir / "checkpoint", ctx.actor, ctx.tokenizer, ctx.critic)
    except TrainingStopped as stopped:
        write_report(stopped.run_dir)
        raise
    finally:
        for env in envs:
            env.close()
    write_report(ctx.run_dir)
    return ctx.run_dir


def run_iterations(ctx: RunContext, progress: bool) -> None:
    """Iterations ctx.first_iteration..cfg.iterations of the run's algorithm, each followed by a
    checkpoint when one is due (or a stop signal asked for one)."""
    cfg = ctx.cfg
    iterate = ppo_iteration if cfg.algorithm == "ppo" else group_iteration
    bar = tqdm(range(ctx.first_iteration, cfg.iterations + 1), desc=cfg.name, disable=not progress,
               dynamic_ncols=True)
    for i in bar:
        record = critic_warmup_iteration(ctx) if i == 0 else iterate(ctx, i)
        bar.set_postfix(success=f"{record['env/success_rate']:.2f}", ret=f"{record['env/episode_return']:.2f}")
        ctx.checkpointer.iteration_done(i)


def ppo_iteration(ctx: RunContext, i: int) -> dict:
    """PPO with dual-discount GAE on a fixed-turn batch; returns the iteration's metrics record."""
    cfg, optim = ctx.cfg, ctx.cfg.optim
    clock = Stopwatch()
    episodes = ctx.collector.collect()                         # n_env streams x e_len turns
    ctx.engine.sleep()                                          # a colocated engine frees memory for the update
    clock.lap("rollout")
    batch = score(ctx, episodes, ctx.critic)                    # logp_old, logp_ref, values_old per token
    estimate_advantages(batch, cfg.ppo)                         # token rewards -> GAE -> advantages, returns
    clock.lap("score")
    actor_stats, critic_stats = Stats(), Stats()
    minibatch_updates(batch.data, optim.mini_batch_size, optim.micro_batch_budget, optim.epochs, ctx.shuffle,
                      [(ctx.critic_opt, ctx.critic_loss, optim.grad_clip, critic_stats),
                       (ctx.actor_opt, ctx.actor_loss, optim.grad_clip, actor_stats)])
    ctx.engine.sync_weights(ctx.actor)
    clock.lap("update")
    return log_iteration(ctx, i, "ppo", episodes, batch, clock.laps,
                         {**actor_stats.means("train/actor/"), **critic_stats.means("train/critic/")})


def group_iteration(ctx: RunContext, i: int) -> dict:
    """A critic-free group estimator (cfg.algorithm) on whole episodes; returns the metrics record.

    Episodes closed by an env error are left out of their group. There is no KL-in-reward term (there
    is no per-token reward to put it in); `actor.kl_loss_coef` puts the KL in the actor loss instead."""
    cfg, optim = ctx.cfg, ctx.cfg.optim
    clock = Stopwatch()
    episodes = ctx.collector.collect()                         # n_tasks x group_size whole episodes
    ctx.engine.sleep()                                          # a colocated engine frees memory for the update
    clock.lap("rollout")
    kept = [e for e in episodes if "error" not in e.metrics]
    batch = score(ctx, kept, critic=None)                       # logp_old, logp_ref per token
    group_advantages_to_tokens(batch, cfg.algorithm)            # outcome reward -> group advantage per token
    clock.lap("score")
    actor_stats = Stats()
    minibatch_updates(batch.data, optim.mini_batch_size, optim.micro_batch_budget, optim.epochs, ctx.shuffle,
                      [(ctx.actor_opt, ctx.actor_loss, optim.grad_clip, actor_stats)])
    ctx.engine.sync_weights(ctx.actor)
    clock.lap("update")
    outcome = sum(e.outcome_reward for e in kept) / max(len(kept), 1)
    return log_iteration(ctx, i, cfg.algorithm, episodes, batch, clock.laps,
                         {**actor_stats.means("train/actor/"), "train/outcome_reward_mean": outcome})


def critic_warmup_iteration(ctx: RunContext) -> dict:
    """Iteration 0 of ppo: `critic.warmup_batches` batches collected with the initial policy, then the
    critic alone fitted to them (train/warmup.py); returns the metrics record."""
    clock = Stopwatch()
    batches, errors = [], 0
    for _ in range(ctx.cfg.critic.warmup_batches):
        batches.append(score(ctx, ctx.collector.collect(), ctx.critic))
        errors += len(ctx.collector.errors)
    stats = critic_warmup(ctx, batches)
    clock.lap("warmup")
    record = {"iteration": 0, "phase": "critic_warmup", "env/errors": errors,
              **episode_metrics([e for b in batches for e in b.episodes]), **stats, **clock.laps}
    return write_records(ctx, record, batches[-1])


def score(ctx: RunContext, episodes: list[Episode], critic) -> PPOBatch:
    """The episodes' rows (per-turn or merged, as the config says) scored by the actor, the reference
    and `critic` (None: no values)."""
    cfg = ctx.cfg
    return prepare(episodes, ctx.actor, ctx.reference, critic, ctx.pad_id, cfg.optim.micro_batch_budget,
                   cfg.rollout.temperature, ctx.device, tokenizer=ctx.tokenizer, **cfg.sample_options(ctx.run_dir))


def log_iteration(ctx: RunContext, i: int, phase: str, episodes: list[Episode], batch: PPOBatch,
                  timings: dict[str, float], update_stats: dict[str, float]) -> dict:
    """The iteration's record: env statistics of every collected episode, the update's statistics,
    the batch's (data, KL, critic fit, sampler consistency), throughput and timings."""
    generated = sum(len(t.response_ids) for e in batch.episodes for t in e.turns)
    trained = float(batch.data["attention_mask"].sum())
    record = {"iteration": i, "phase": phase, "env/errors": len(ctx.collector.errors),
              **episode_metrics(episodes), **update_stats, **batch_metrics(batch, ctx.cfg.actor.tis_cap),
              "perf/rollout_tokens_per_s": generated / timings["timing/rollout_s"],
              "perf/train_tokens_per_s": trained / (timings["timing/score_s"] + timings["timing/update_s"]),
              **timings}
    return write_records(ctx, record, batch)


def write_records(ctx: RunContext, record: dict, batch: PPOBatch) -> dict:
    """`record` to every metrics sink, two sample episodes of `batch` to trajectories.jsonl."""
    ctx.metrics.write(record)
    write_trajectories(ctx.run_dir, trajectory_records(record["iteration"], batch.episodes, batch.samples,
                                                       batch.data["advantages"], ctx.tokenizer))
    return record


class Stopwatch:
    """`lap(name)` records the seconds since the previous lap (or the start) as laps["timing/<name>_s"]."""

    def __init__(self):
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[f"timing/{name}_s"] = now - self._last
        self._last = now
