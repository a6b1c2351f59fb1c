"""The training loop: one outer loop, one iteration function per algorithm family.

    ppo_iteration     collect n_env x e_len turns -> per-turn rows scored by actor, reference, critic
                      -> token rewards (env reward on the last token, -kl_coef * KL on every token)
                      -> dual-discount GAE -> update critic and actor -> sync weights to the engine
    group_iteration   collect n_tasks x group_size whole episodes -> outcome reward per episode
                      -> rows scored by actor and reference -> group advantage on every sampled token
                      -> update actor -> sync weights to the engine          (grpo, dr_grpo, rloo, reinforce_pp)
                      gigpo: + each turn's discounted return normalised among the turns of its group
                      that start in the same env state (step-level credit, algos/gigpo.py)

A network scores the rows only when a term reads its scores (`needed_scores`): the reference only for a
KL term, the actor only for the KL in the reward or an update of more than one optimizer step.

Iteration 0 of a ppo run is the critic warmup (`critic_warmup_iteration`). Every iteration's record
goes to each metrics sink (metrics.jsonl always) and two sample episodes to trajectories.jsonl; the
run ends by writing report.html. Every `save_every` iterations, after the last one and when a
SIGINT/SIGTERM asks the run to stop, the whole training state is saved in checkpoints/
(train/checkpoint.py), from which `train(..., resume=RUN)` continues exactly. A stop signal before the
first checkpoint (the warm start, the critic warmup) ends the run within seconds, with nothing saved
(StoppedBeforeCheckpoint). An iteration in which every rollout failed ends the run with RolloutsFailed,
naming the causes; nothing is saved on the way out, so the last checkpoint stays the last good one.
With `validation` set, the iterations it names end with greedy episodes on validation seeds, and the best
policy so far is kept as best/ (train/validation.py).
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

import torch
from tqdm import tqdm

from horizonrl.algos.registry import Batches
from horizonrl.config import ConfigError, TrainConfig
from horizonrl.engines.registry import ENGINES, engine
from horizonrl.learner.device import precision
from horizonrl.learner.distributed import LOCAL, Ranks, start_ranks, stop_ranks
from horizonrl.learner.lora import merged_parameters
from horizonrl.learner.update import Stats, minibatch_updates, single_optimizer_step
from horizonrl.records import Episode
from horizonrl.report.html import write_report
from horizonrl.report.metrics import episode_metrics
from horizonrl.report.sinks import check_sinks
from horizonrl.report.trajectories import trajectory_records, write_trajectories
from horizonrl.rollout.failures import RolloutsFailed
from horizonrl.rollout.producer import Producer
from horizonrl.samples.split_advice import split_advice
from horizonrl.train.batch import (PPOBatch, batch_metrics, estimate_advantages, gigpo_advantages_to_tokens,
                                   group_advantages_to_tokens, kept_episodes, played_episodes, prepare, score_batch)
from horizonrl.train.checkpoint import (StopSignals, TrainingStopped, complete_checkpoints, prepare_resume,
                                        save_checkpoint)
from horizonrl.train.collectors import run_envs
from horizonrl.train.context import RunContext, start_run
from horizonrl.train.producer_process import ProducerProcess
from horizonrl.train.sync_check import EngineOutOfSync
from horizonrl.train.validation import Validation
from horizonrl.train.warmup import critic_warmup

log = logging.getLogger(__name__)


def train(cfg: TrainConfig, progress: bool = True, resume: Path | None = None) -> Path:
    """Run a whole training job; returns the run folder runs/<name>-<time>/, report.html written last.

    `resume`: continue that run folder (`cfg`: its config, see checkpoint.resume_config) from its last
    checkpoint. A SIGINT or SIGTERM stops the run at the next iteration boundary with a checkpoint, and
    TrainingStopped is raised once report.html is written; before the first checkpoint (the warm start,
    the critic warmup) it stops the run within seconds with StoppedBeforeCheckpoint, nothing saved.

    Launched by torchrun (WORLD_SIZE set), every rank runs this same function on its share of the
    streams or tasks (see train/context.py); rank 0 alone writes the logs and the report."""
    with precision(cfg.precision):
        check_sinks(cfg.report_to)
        ranks, device = start_ranks(cfg.dist, cfg.device)
        try:
            check_world_size(cfg, ranks.world_size)
            point = ranks.broadcast(prepare_resume(resume, cfg) if resume is not None and ranks.is_main else None)
            torch.manual_seed(cfg.seed)
            envs = [] if cfg.rollout.async_training.in_a_process else run_envs(cfg, ranks)  # or the producer's
            try:
                with StopSignals() as signals:
                    ctx = start_run(cfg, envs, signals, point, ranks, device)
                    with ctx.metrics or contextlib.nullcontext(), contextlib.closing(ctx.engine), \
                            contextlib.closing(ctx.collector):
                        run_iterations(ctx, progress and ranks.is_main)
                    save_checkpoint(ctx.run_dir / "checkpoint", ctx.actor, ctx.tokenizer, ctx.critic, ranks)
            except TrainingStopped as stopped:
                if ranks.is_main:
                    write_report(stopped.run_dir)
                raise
            finally:
                for env in envs:
                    env.close()
            if ranks.is_main:
                write_report(ctx.run_dir)
            ranks.barrier()   # no rank tears the process group down while another still holds its connections
            return ctx.run_dir
        finally:
            stop_ranks(ranks)


def check_world_size(cfg: TrainConfig, world_size: int) -> None:
    """Every rank needs a share of the streams (and of the tasks), and mini-batches that split evenly."""
    if world_size == 1:
        return
    if cfg.validation is not None:
        raise ConfigError("validation: plays the policy in one process (a sharded actor needs every rank to "
                          "generate); set it to null under torchrun")
    if cfg.rollout.engine_spec.one_server_per_job:
        per_rank = ", ".join(name for name in ENGINES if not engine(name).one_server_per_job)
        raise ConfigError(f"rollout.engine: {cfg.rollout.engine} under torchrun would have every rank reload one "
                          f"server's weights; use {per_rank} (an engine per rank)")
    shared = {"optim.mini_batch_size": cfg.optim.mini_batch_size}
    if cfg.task is None:
        shared["rollout.n_env"] = cfg.rollout.n_env
    if cfg.algorithm_spec.batches is Batches.GROUPS:
        shared["group.n_tasks"] = cfg.group.n_tasks
    for key, value in shared.items():
        if value % world_size:
            raise ConfigError(f"{key}: {value} is not a multiple of the {world_size} ranks (torchrun "
                              "--nproc_per_node x nodes): each rank takes an equal share")


def run_iterations(ctx: RunContext, progress: bool) -> None:
    """Iterations ctx.first_iteration..cfg.iterations of the run's algorithm (fewer when cfg.budget is spent
    first), each followed by a checkpoint when one is due (or a stop signal asked for one). An iteration whose
    rollouts all failed raises RolloutsFailed, naming the iteration and what the run folder keeps."""
    cfg = ctx.cfg
    iterate = {Batches.STREAMS: ppo_iteration, Batches.GROUPS: group_iteration}[cfg.algorithm_spec.batches]
    validation = Validation(cfg, ctx.run_dir, ctx.first_iteration) if cfg.validation is not None else None
    if validation is not None and ctx.first_iteration == 1:     # no iteration 0 (critic warmup) validates the start
        validation.run(0, ctx.actor, ctx.tokenizer, ctx.device)
    bar = tqdm(range(ctx.first_iteration, cfg.iterations + 1), desc=cfg.name, disable=not progress,
               dynamic_ncols=True)
    for i in bar:
        try:
            record = critic_warmup_iteration(ctx, progress) if i == 0 else iterate(ctx, i)
        except RolloutsFailed as failed:
            raise RolloutsFailed(f"iteration {i}: {failed}\n{what_is_kept(ctx)}") from None
        except EngineOutOfSync as out_of_sync:
            raise EngineOutOfSync(f"{out_of_sync}\n{what_is_kept(ctx)}") from None
        bar.set_postfix(success=f"{record['env/success_rate']:.2f}", ret=f"{record['env/episode_return']:.2f}")
        budget_spent = ctx.checkpointer.iteration_done(i)
        if validation is not None and validation.due(i, last=budget_spent or i == cfg.iterations):
            validation.run(i, ctx.actor, ctx.tokenizer, ctx.device)
        if budget_spent:
            break


def what_is_kept(ctx: RunContext) -> str:
    """What the run folder of a run that ends on an error keeps (nothing is saved on the way out)."""
    saved = complete_checkpoints(ctx.run_dir)
    if not saved:
        return f"The run folder {ctx.run_dir} has no checkpoint yet; nothing was saved on the way out."
    return (f"The run folder {ctx.run_dir} keeps its last checkpoint, {saved[-1].name}; nothing was saved on the way "
            f"out. Once the cause is fixed, continue with:\n    horizonrl train --resume {ctx.run_dir}")


def ppo_iteration(ctx: RunContext, i: int) -> dict:
    """PPO with dual-discount GAE on a fixed-turn batch; returns the iteration's metrics record."""
    cfg, optim = ctx.cfg, ctx.cfg.optim
    clock = Stopwatch()
    episodes = collect_turns(ctx)                               # n_env streams x e_len turns
    ctx.sync_check.start(episodes, ctx.engine, ctx.actor)       # the first batch: probe rows, gap on equal weights
    ctx.engine.sleep()                                          # a colocated engine frees memory for the update
    clock.lap("rollout")
    batch = score(ctx, episodes, ctx.critic)                    # values_old (+ logp_old, logp_ref) per token
    estimate_advantages(batch, cfg.ppo, ctx.ranks)              # token rewards -> GAE -> advantages, returns
    clock.lap("score")
    actor_stats, critic_stats = Stats(), Stats()
    minibatch_updates(batch.data, optim.mini_batch_size, ctx.micro_batch_budget, optim.epochs, ctx.shuffle,
                      [(ctx.critic_opt, ctx.critic_loss, optim.grad_clip, critic_stats),
                       (ctx.actor_opt, ctx.actor_loss(i), optim.grad_clip, actor_stats)], ctx.ranks)
    probe = sync_engine(ctx)
    clock.lap("update")
    return log_iteration(ctx, i, cfg.algorithm, episodes, batch, clock.laps,
                         {**actor_stats.means("train/actor/"), **critic_stats.means("train/critic/"), **probe,
                          "train/actor/entropy_coef": ctx.entropy_coef(i)})


def group_iteration(ctx: RunContext, i: int) -> dict:
    """A critic-free group estimator (cfg.algorithm) on whole episodes; returns the metrics record.

    Episodes closed by an env error or a failed agent are left out of their group; a rank left with none
    is an error on every rank (`kept_episodes`). There is no KL-in-reward term (there
    is no per-token reward to put it in); `actor.kl_loss_coef` puts the KL in the actor loss instead."""
    cfg, optim = ctx.cfg, ctx.cfg.optim
    clock = Stopwatch()
    episodes = ctx.collector.collect()                         # n_tasks x group_size whole episodes
    kept = kept_episodes(episodes, ctx.ranks)                  # a batch with none to train on is an error
    ctx.sync_check.start(kept, ctx.engine, ctx.actor)           # the first batch: probe rows, gap on equal weights
    ctx.engine.sleep()                                          # a colocated engine frees memory for the update
    clock.lap("rollout")
    batch = score(ctx, kept, critic=None)                       # logp_old, logp_ref per token where read
    if cfg.algorithm_spec.step_credit:                          # + step advantage from turns in the same state
        step_stats = gigpo_advantages_to_tokens(batch, cfg.gigpo, ctx.ranks)
    else:                                                       # outcome reward -> group advantage per token
        step_stats = {}
        group_advantages_to_tokens(batch, cfg.algorithm_spec.estimator, ctx.ranks)
    clock.lap("score")
    actor_stats = Stats()
    minibatch_updates(batch.data, optim.mini_batch_size, ctx.micro_batch_budget, optim.epochs, ctx.shuffle,
                      [(ctx.actor_opt, ctx.actor_loss(i), optim.grad_clip, actor_stats)], ctx.ranks)
    probe = sync_engine(ctx)
    clock.lap("update")
    outcome_sum, n_kept = ctx.ranks.sum([sum(e.outcome_reward for e in kept), len(kept)])
    outcome = outcome_sum / max(n_kept, 1)
    return log_iteration(ctx, i, cfg.algorithm, episodes, batch, clock.laps,
                         {**actor_stats.means("train/actor/"), "train/actor/entropy_coef": ctx.entropy_coef(i),
                          "train/outcome_reward_mean": outcome, **step_stats, **probe})


def critic_warmup_iteration(ctx: RunContext, progress: bool = False) -> dict:
    """Iteration 0 of ppo: `critic.warmup_batches` batches collected with the initial policy, then the
    critic alone fitted to them (train/warmup.py); returns the metrics record. A stop signal ends it between
    two batches, before the first checkpoint (StoppedBeforeCheckpoint). `progress`: a second bar, under the
    run's (which stays at 0 meanwhile), counts the batches collected, then those fitted (warmup_iters passes)."""
    clock = Stopwatch()
    batches, errors = [], 0
    signals, critic = ctx.checkpointer.signals, ctx.cfg.critic
    with signals.within("the critic warmup", ctx.run_dir, ctx.ranks), \
            tqdm(total=critic.warmup_batches * (1 + critic.warmup_iters), desc="critic warmup: collect",
                 unit="batch", disable=not progress, position=1, leave=False, dynamic_ncols=True) as bar:
        for _ in range(critic.warmup_batches):
            signals.check()
            batches.append(score(ctx, collect_turns(ctx), critic=None, updates_actor=False))  # values: critic_warmup
            errors += len(ctx.collector.errors)
            bar.update()
        bar.set_description("critic warmup: fit")
        stats = critic_warmup(ctx, batches, fitted=bar.update)
    clock.lap("warmup")
    record = {"iteration": 0, "phase": "critic_warmup", "env/errors": int(ctx.ranks.sum([errors])[0]),
              **episode_metrics([e for b in batches for e in b.episodes], ctx.ranks), **stats, **clock.laps}
    return write_records(ctx, record, batches[-1])


def collect_turns(ctx: RunContext) -> list[Episode]:
    """This rank's share of a fixed-turn batch (n_env streams x e_len turns); when some rank played no turn, an
    error on every rank (`played_episodes`)."""
    n_turns = len(ctx.ranks.share(ctx.cfg.rollout.n_env)) * ctx.cfg.ppo.e_len
    return played_episodes(ctx.collector.collect(), n_turns, ctx.collector.errors, ctx.ranks)


def score(ctx: RunContext, episodes: list[Episode], critic, updates_actor: bool = True) -> PPOBatch:
    """The episodes' rows (per-turn or merged, as the config says) scored by `critic` (None: no values) and
    by the actor and the reference where `needed_scores` says (`updates_actor`: the batch trains the actor)."""
    cfg = ctx.cfg
    batch = prepare(episodes, ctx.pad_id, ctx.device, tokenizer=ctx.tokenizer,
                    weights_version=ctx.engine.weights_version, **cfg.sample_options(ctx.run_dir))
    n_rows = len(batch.data["input_ids"]) if updates_actor else None
    old, ref = needed_scores(cfg, n_rows, ctx.ranks)
    score_batch(batch, ctx.pad_id, ctx.micro_batch_budget, cfg.rollout.temperature,
                actor=ctx.actor if old else None, reference=ctx.reference if ref else None, critic=critic,
                ranks=ctx.ranks)
    return batch


def needed_scores(cfg: TrainConfig, n_rows: int | None, ranks: Ranks = LOCAL) -> tuple[bool, bool]:
    """(logp_old, logp_ref): whether a term of the iteration reads the actor's, and the reference's, log-probs
    of a batch of `n_rows` rows (on this rank; None: a batch that trains no actor, the critic warmup's).

    The KL in the reward (an algorithm with a critic, ppo.kl_coef > 0) reads both. The actor loss reads logp_ref with
    actor.kl_loss_coef > 0, and logp_old unless the update is one optimizer step: then the update's own
    forward, detached, is the old policy (learner/update.py actor_loss_fn), as in TRL's GRPOTrainer."""
    kl_in_reward = cfg.algorithm_spec.critic and cfg.ppo.kl_coef > 0
    if n_rows is None:
        return kl_in_reward, kl_in_reward
    one_step = single_optimizer_step(n_rows, cfg.optim.mini_batch_size, cfg.optim.epochs, ranks)
    return kl_in_reward or not one_step, kl_in_reward or cfg.actor.kl_loss_coef > 0


def sync_engine(ctx: RunContext) -> dict[str, float]:
    """The engine samples from the updated actor: its own module, or a copy refreshed one whole
    tensor at a time from the actor's shards (every rank gathers, in the same order). Returns the served-policy
    check's metrics (train/sync_check.py: EngineOutOfSync when the engine did not take the weights)."""
    ctx.engine.sync_weights(ctx.actor, merged_parameters(ctx.actor))
    return ctx.sync_check.after_sync(ctx.engine, ctx.actor)


def log_iteration(ctx: RunContext, i: int, phase: str, episodes: list[Episode], batch: PPOBatch,
                  timings: dict[str, float], update_stats: dict[str, float]) -> dict:
    """The iteration's record: env statistics of every collected episode, the collector's counts (the
    gateway's, `gateway/*`), the update's statistics (with the KL to the reference and the sampler's
    consistency), the batch's (data, critic fit), throughput and timings; every rank's, reduced from each
    rank's sums and counts (no episode or row crosses the ranks). With optim.shared_prefix,
    `perf/shared_prefix_share`: the share of the learner's row tokens (scoring and update) computed once for rows
    that share them. `timing/rollout_s` is how long the batch took
    to play: the learner's wait for it, or with a producer (rollout.async_training) the producer's time from the
    batch's start to its delivery, the learner's wait being `async/learner_wait_s`."""
    counts = ctx.collector.counts
    producer = ctx.collector if isinstance(ctx.collector, (Producer, ProducerProcess)) else None
    if producer is not None:      # the batch was played ahead: its time is the producer's, not the learner's wait
        timings = {**timings, "timing/rollout_s": producer.taken.played_s}
    generated, trained, errors, *counted = ctx.ranks.sum([
        sum(len(t.response_ids) for e in batch.episodes for t in e.turns), float(batch.data["attention_mask"].sum()),
        len(ctx.collector.errors), *counts.values()])
    record = {"iteration": i, "phase": phase, "env/errors": int(errors), **dict(zip(counts, map(int, counted))),
              **episode_metrics(episodes, ctx.ranks), **update_stats,
              **batch_metrics(batch, ctx.ranks),
              "perf/rollout_tokens_per_s": generated / timings["timing/rollout_s"],
              "perf/train_tokens_per_s": trained / (timings["timing/score_s"] + timings["timing/update_s"]),
              **timings}
    if producer is not None:
        record.update(producer.metrics(ctx.ranks))
    if ctx.sharing:                 # optim.shared_prefix: the learner's row tokens a shared prefix's pass stood for
        tokens, skipped = ctx.ranks.sum([sum(counts) for counts in zip(*(s.taken() for s in ctx.sharing))])
        record["perf/shared_prefix_share"] = skipped / max(tokens, 1)
    explain_splits(ctx, record)
    return write_records(ctx, record, batch)


def explain_splits(ctx: RunContext, record: dict) -> None:
    """Once per run (rank 0 logs it): why most of the turns of the iteration of `record` that could have merged
    split, when they did (samples/split_advice.py). Every rank sees the same record, so agrees."""
    if ctx.splits_explained or "data/merge/turns" not in record:
        return
    advice = split_advice(record)
    if advice is not None:
        ctx.splits_explained = True
        if ctx.ranks.is_main:
            log.warning(advice)


def write_records(ctx: RunContext, record: dict, batch: PPOBatch) -> dict:
    """`record`, with the run's progress (train/budget.py), to every metrics sink, two sample episodes of
    `batch` to trajectories.jsonl (rank 0's)."""
    record.update(ctx.checkpointer.state.progress.advance(record["env/turns"]))   # env/turns: every rank's
    if not ctx.ranks.is_main:
        return record
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
