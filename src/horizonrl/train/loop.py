"""The training loop: PPO with dual-discount GAE, critic warmup and fixed-turn batching
(or, with `algorithm` grpo / dr_grpo / rloo / reinforce_pp, train/group_loop.py on episode groups of
an env, or of an agent-loop task: train/tasks.py).

    collect n_env x e_len turns  ->  per-turn rows  ->  score (logp_old, logp_ref, V)
    ->  token rewards (env reward on the last token, -beta * KL on every token)
    ->  dual-discount GAE  ->  update critic, update actor  ->  sync weights to the engine

Each iteration appends its record to metrics.jsonl and a few sample episodes to trajectories.jsonl
(iteration 0: the critic warmup); the run ends by writing report.html from them (report/html.py).
Every `save_every` iterations, after the last one and when a SIGINT/SIGTERM asks the run to stop, the
whole training state is saved in checkpoints/ (train/checkpoint.py), from which `train(..., resume=RUN)`
continues exactly.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import torch
from tqdm import tqdm

from horizonrl import envs as env_registry
from horizonrl.config import TrainConfig, dump
from horizonrl.envs.pool import open_envs
from horizonrl.learner.device import resolve_device
from horizonrl.learner.models import ValueModel, frozen_copy, load_policy, pad_token_id
from horizonrl.learner.update import Stats, actor_loss_fn, critic_loss_fn, minibatch_updates
from horizonrl.learner.warm_start import build_tiny_for_envs, format_warm_start
from horizonrl.report.html import write_report
from horizonrl.report.metrics import MetricsLog, episode_metrics
from horizonrl.report.trajectories import trajectory_records, write_trajectories
from horizonrl.rollout.episode_groups import EpisodeGroupCollector, load_reward_fn
from horizonrl.rollout.fixed_turn import FixedTurnCollector
from horizonrl.rollout.from_config import make_agent, make_engine, sampling_params
from horizonrl.train.batch import batch_metrics, estimate_advantages, prepare
from horizonrl.train.checkpoint import (Checkpointer, ResumePoint, StopSignals, TrainingState, TrainingStopped,
                                        prepare_resume, reference_policy, save_checkpoint)
from horizonrl.train.group_loop import group_iterations
from horizonrl.train.tasks import build_tiny_for_task, task_collector, task_warm_start
from horizonrl.train.warmup import critic_warmup


def train(cfg: TrainConfig, progress: bool = True, resume: Path | None = None) -> Path:
    """Run a whole training job; returns the run folder runs/<name>-<time>/, report.html written last.

    `resume`: continue that run folder (`cfg`: its config, see checkpoint.resume_config) from its last
    checkpoint. A SIGINT or SIGTERM stops the run at the next iteration boundary with a checkpoint, and
    TrainingStopped is raised once report.html is written."""
    point = prepare_resume(resume, cfg) if resume is not None else None
    torch.manual_seed(cfg.seed)
    envs = [] if cfg.task is not None else open_envs(cfg.env.ids, cfg.env.kwargs, cfg.rollout.n_env, cfg.env.workers,
                                                     cfg.env.timeout_s)
    try:
        with StopSignals() as signals:
            run_dir = _train(cfg, envs, progress, signals, point)
    except TrainingStopped as stopped:
        write_report(stopped.run_dir)
        raise
    finally:
        for env in envs:
            env.close()
    write_report(run_dir)
    return run_dir


def _train(cfg: TrainConfig, envs: list, progress: bool, signals: StopSignals, resume: ResumePoint | None) -> Path:
    device = resolve_device(cfg.device)
    ppo, rollout = cfg.ppo, cfg.rollout

    # Networks: the policy (loaded, or tiny + format warm start; resuming: the checkpoint's), a critic
    # from its backbone, a frozen reference (the initial policy).
    if resume is None:
        tokenizer, actor = build_policy(cfg, device)
        agent = make_agent(tokenizer, cfg.agent)
        if cfg.model.path is None and cfg.model.warm_start:
            if cfg.task is not None:
                task_warm_start(actor, tokenizer, cfg)
            else:
                format_warm_start(actor, agent, envs, cfg.model.warm_start, rollout.e_len, cfg.seed)
        run_dir = make_run_dir(cfg)
        if cfg.model.path is None:
            save_checkpoint(run_dir / "init", actor, tokenizer)
        reference = frozen_copy(actor)
    else:
        run_dir = resume.run_dir
        tokenizer, actor = load_policy(str(resume.folder), device)
        agent = make_agent(tokenizer, cfg.agent)
        reference = reference_policy(cfg, run_dir, device)
    actor.eval()  # dropout off: the sampler and the learner compute the same function
    pad_id = pad_token_id(tokenizer)
    actor_opt = torch.optim.AdamW(actor.parameters(), lr=ppo.actor_lr, weight_decay=ppo.weight_decay)
    actor_loss = actor_loss_fn(actor, ppo.clip_low, ppo.clip_high, ppo.dual_clip, ppo.entropy_coef, ppo.loss_agg,
                               rollout.temperature, ppo.kl_loss_coef)
    shuffle = torch.Generator().manual_seed(cfg.seed)

    # Rollout: the engine samples from the actor itself (shared weights, nothing to copy in-process).
    engine = make_engine(actor, tokenizer, rollout, cfg.seed, device)
    params = sampling_params(rollout, tokenizer, actor, agent)
    metrics_log = MetricsLog(run_dir / "metrics.jsonl")
    if cfg.algorithm != "ppo":
        collector = (task_collector(cfg, tokenizer, engine, params) if cfg.task is not None else
                     EpisodeGroupCollector(envs, cfg.env.ids[0], agent, engine, params, cfg.group.group_size,
                                           cfg.group.max_turns, load_reward_fn(cfg.group.reward_fn), cfg.seed))
        state = TrainingState(actor, tokenizer, actor_opt, shuffle, engine, collector)
        first = state.restore(resume.folder) + 1 if resume is not None else 1
        group_iterations(cfg, collector, engine, actor, reference, actor_opt, actor_loss, pad_id, shuffle,
                         metrics_log, device, progress, tokenizer, run_dir, Checkpointer(run_dir, state, cfg, signals),
                         first)
        save_checkpoint(run_dir / "checkpoint", actor, tokenizer)
        return run_dir

    critic = ValueModel.from_policy(actor).eval()
    critic_opt = torch.optim.AdamW(critic.parameters(), lr=ppo.critic_lr, weight_decay=ppo.weight_decay)
    critic_loss = critic_loss_fn(critic, ppo.value_clip, ppo.first_token_weight)
    collector = FixedTurnCollector(envs, agent, engine, params, rollout.e_len, cfg.seed)
    state = TrainingState(actor, tokenizer, actor_opt, shuffle, engine, collector, critic, critic_opt)
    checkpointer = Checkpointer(run_dir, state, cfg, signals)
    first = state.restore(resume.folder) + 1 if resume is not None else 0  # 0: the critic warmup

    def collect_and_score():
        started = time.perf_counter()
        episodes = collector.collect()
        rollout_s = time.perf_counter() - started
        batch = prepare(episodes, actor, reference, critic, pad_id, ppo.micro_batch_budget, rollout.temperature,
                        device, tokenizer=tokenizer, **cfg.sample_options(run_dir))
        return batch, rollout_s, time.perf_counter() - started - rollout_s

    if first == 0 and ppo.warmup_batches and ppo.warmup_iters:
        started = time.perf_counter()
        batches, errors = [], 0
        for _ in range(ppo.warmup_batches):
            batches.append(collect_and_score()[0])
            errors += len(collector.errors)
        record = {"iteration": 0, "phase": "critic_warmup", "env/errors": errors}
        record.update(episode_metrics([e for b in batches for e in b.episodes]))
        record.update(critic_warmup(batches, critic, critic_opt, critic_loss, ppo, pad_id, shuffle))
        record["timing/warmup_s"] = time.perf_counter() - started
        metrics_log.write(record)
        write_trajectories(run_dir, trajectory_records(0, batches[-1].episodes, batches[-1].samples,
                                                       batches[-1].data["advantages"], tokenizer))
        checkpointer.iteration_done(0)

    bar = tqdm(range(max(first, 1), cfg.iterations + 1), desc=cfg.name, disable=not progress, dynamic_ncols=True)
    for iteration in bar:
        batch, rollout_s, score_s = collect_and_score()
        estimate_advantages(batch, ppo)

        started = time.perf_counter()
        actor_stats, critic_stats = Stats(), Stats()
        minibatch_updates(batch.data, ppo.mini_batch_size, ppo.micro_batch_budget, ppo.epochs, shuffle,
                          [(critic_opt, critic_loss, ppo.grad_clip, critic_stats),
                           (actor_opt, actor_loss, ppo.grad_clip, actor_stats)])
        engine.sync_weights(actor)
        update_s = time.perf_counter() - started

        generated = sum(len(t.response_ids) for e in batch.episodes for t in e.turns)
        record = {"iteration": iteration, "phase": "ppo", "env/errors": len(collector.errors),
                  **episode_metrics(batch.episodes),
                  **actor_stats.means("train/actor/"), **critic_stats.means("train/critic/"),
                  **batch_metrics(batch),
                  "perf/rollout_tokens_per_s": generated / rollout_s,
                  "perf/train_tokens_per_s": float(batch.data["attention_mask"].sum()) / (score_s + update_s),
                  "timing/rollout_s": rollout_s, "timing/score_s": score_s, "timing/update_s": update_s}
        metrics_log.write(record)
        write_trajectories(run_dir, trajectory_records(iteration, batch.episodes, batch.samples,
                                                       batch.data["advantages"], tokenizer))
        bar.set_postfix(success=f"{record['env/success_rate']:.2f}", ret=f"{record['env/episode_return']:.2f}")
        checkpointer.iteration_done(iteration)

    save_checkpoint(run_dir / "checkpoint", actor, tokenizer, critic)
    return run_dir


def build_policy(cfg: TrainConfig, device) -> tuple:
    """(tokenizer, policy): loaded from `model.path`, else a tiny model for the task or the env(s)."""
    if cfg.model.path is not None:
        return load_policy(cfg.model.path, device)
    if cfg.task is not None:
        return build_tiny_for_task(cfg, device)
    envs = [env_registry.make(env_id, **cfg.env.kwargs) for env_id in cfg.env.ids]
    return build_tiny_for_envs(envs, cfg.model.tiny, cfg.seed, device)


def make_run_dir(cfg: TrainConfig) -> Path:
    """runs/<name>-<time>/ with the resolved config.yaml."""
    base = Path(cfg.output_dir) / f"{cfg.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    run_dir, n = base, 1
    while run_dir.exists():
        n += 1
        run_dir = base.with_name(f"{base.name}-{n}")
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(dump(cfg))
    return run_dir
