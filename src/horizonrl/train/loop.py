"""The training loop: one outer loop over the iterations of the run's algorithm family, read from its registry
row (algos/registry.py: which batches it plays):

    fixed-turn streams   train/ppo.py     ppo_iteration: collect, score, GAE, update critic and actor, sync, record
    episode groups       train/group.py   group_iteration: the same with a group estimator or GiGPO, no critic

The phases both share (scoring only what a term reads, the weight sync, the record) are train/phases.py.

Iteration 0 of a run with a critic is the critic warmup (`ppo.critic_warmup_iteration`). Every iteration's record
goes to each metrics sink (metrics.jsonl always) and two sample episodes to trajectories.jsonl; the
run ends by writing report.html. Every `save_every` iterations, after the last one and when a
SIGINT/SIGTERM asks the run to stop, the whole training state is saved in checkpoints/
(runstate/checkpoint.py), from which `train(..., resume=RUN)` continues exactly. A stop signal before the
first checkpoint (the warm start, the critic warmup) ends the run within seconds, with nothing saved
(StoppedBeforeCheckpoint). An iteration in which every rollout failed ends the run with RolloutsFailed,
naming the causes; nothing is saved on the way out, so the last checkpoint stays the last good one.
With `validation` set, the iterations it names end with greedy episodes on validation seeds, and the best
policy so far is kept as best/ (train/validation.py).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from horizonrl import runfolder
from horizonrl.algos.registry import Batches
from horizonrl.config import ConfigError, TrainConfig
from horizonrl.engines.registry import ENGINES, engine
from horizonrl.learner.device import precision
from horizonrl.learner.distributed import start_ranks, stop_ranks
from horizonrl.report.html import write_report
from horizonrl.report.sinks import check_sinks
from horizonrl.rollout.failures import RolloutsFailed
from horizonrl.train import group, phases, ppo
from horizonrl.runstate.checkpoint import (StopSignals, TrainingStopped, complete_checkpoints, prepare_resume,
                                        save_checkpoint)
from horizonrl.assembly.collectors import run_envs
from horizonrl.assembly.context import RunContext, start_run
from horizonrl.assembly.sync_check import EngineOutOfSync
from horizonrl.train.validation import Validation

log = logging.getLogger(__name__)


def train(cfg: TrainConfig, progress: bool = True, resume: Path | None = None) -> Path:
    """Run a whole training job; returns the run folder runs/<name>-<time>/, report.html written last.

    `resume`: continue that run folder (`cfg`: its config, see checkpoint.resume_config) from its last
    checkpoint. A SIGINT or SIGTERM stops the run at the next iteration boundary with a checkpoint, and
    TrainingStopped is raised once report.html is written; before the first checkpoint (the warm start,
    the critic warmup) it stops the run within seconds with StoppedBeforeCheckpoint, nothing saved.

    Launched by torchrun (WORLD_SIZE set), every rank runs this same function on its share of the
    streams or tasks (see assembly/context.py); rank 0 alone writes the logs and the report."""
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
                    save_checkpoint(ctx.run_dir / runfolder.CHECKPOINT, ctx.actor, ctx.tokenizer, ctx.critic, ranks)
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
    first). After each: the run's progress (runstate/budget.py) goes into its record, the record to the sinks, a
    checkpoint when one is due or the run ends here, and a stop signal ends the run (TrainingStopped) once that
    checkpoint is saved. An iteration whose rollouts all failed raises RolloutsFailed, naming the iteration and
    what the run folder keeps."""
    cfg = ctx.cfg
    iterate = family_iteration(cfg)
    validation = Validation(cfg, ctx.run_dir, ctx.first_iteration) if cfg.validation is not None else None
    if validation is not None and ctx.first_iteration == 1:     # no iteration 0 (critic warmup) validates the start
        validation.run(0, ctx.actor, ctx.tokenizer, ctx.device)
    bar = tqdm(range(ctx.first_iteration, cfg.iterations + 1), desc=cfg.name, disable=not progress,
               dynamic_ncols=True)
    for i in bar:
        try:
            done = ppo.critic_warmup_iteration(ctx, progress) if i == 0 else iterate(ctx, i)
        except RolloutsFailed as failed:
            raise RolloutsFailed(f"iteration {i}: {failed}\n{what_is_kept(ctx)}") from None
        except EngineOutOfSync as out_of_sync:
            raise EngineOutOfSync(f"{out_of_sync}\n{what_is_kept(ctx)}") from None
        record = done.record
        record.update(ctx.progress.advance(record["env/turns"]))     # env/turns: every rank's
        phases.write_records(ctx, done)
        bar.set_postfix(success=f"{record['env/success_rate']:.2f}", ret=f"{record['env/episode_return']:.2f}")
        spent, signum = stop_reasons(ctx)
        ctx.checkpointer.save_if_due(i, ends_run=spent or bool(signum) or i == cfg.iterations)
        if signum:
            raise TrainingStopped(ctx.run_dir, i, signum)
        if validation is not None and validation.due(i, last=spent or i == cfg.iterations):
            validation.run(i, ctx.actor, ctx.tokenizer, ctx.device)
        if spent:
            break


def family_iteration(cfg: TrainConfig) -> Callable[[RunContext, int], phases.Iteration]:
    """The iteration function of the run's family, by the batches its algorithm plays (looked up at each call, so
    that a test that replaces ppo.ppo_iteration or group.group_iteration is heard)."""
    return {Batches.STREAMS: ppo.ppo_iteration, Batches.GROUPS: group.group_iteration}[cfg.algorithm_spec.batches]


def stop_reasons(ctx: RunContext) -> tuple[bool, int]:
    """(whether cfg.budget is spent, the stop signal's number or 0) after an iteration. Under torchrun a signal to
    any rank, or a budget spent by any rank's clock, stops every rank at the same boundary."""
    signum = ctx.ranks.max(ctx.checkpointer.signals.signum or 0)
    spent = ctx.ranks.max(int(ctx.progress.spent(ctx.cfg.budget)))
    return bool(spent), signum


def what_is_kept(ctx: RunContext) -> str:
    """What the run folder of a run that ends on an error keeps (nothing is saved on the way out)."""
    saved = complete_checkpoints(ctx.run_dir)
    if not saved:
        return f"The run folder {ctx.run_dir} has no checkpoint yet; nothing was saved on the way out."
    return (f"The run folder {ctx.run_dir} keeps its last checkpoint, {saved[-1].name}; nothing was saved on the way "
            f"out. Once the cause is fixed, continue with:\n    horizonrl train --resume {ctx.run_dir}")
