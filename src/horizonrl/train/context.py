"""The run context: everything a training run builds once, before its first iteration.

    policy (loaded, or tiny + warm start; resuming: the checkpoint's) -> frozen reference -> optimiser
    -> engine (samples from the actor itself) -> collector (fixed-turn for ppo, episode or task groups
    for the group algorithms) -> critic (ppo) -> metrics sinks -> checkpointer (restores a resumed run)

The iteration functions (train/loop.py) read and change only what the context holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from horizonrl import envs as env_registry
from horizonrl.config import TrainConfig, dump
from horizonrl.engines.base import TrainingEngine
from horizonrl.learner.device import resolve_device
from horizonrl.learner.models import ValueModel, frozen_copy, load_policy, pad_token_id
from horizonrl.learner.update import LossFn, actor_loss_fn, critic_loss_fn
from horizonrl.report.sinks import MetricsSinks
from horizonrl.rollout.collector import Collector
from horizonrl.rollout.episode_groups import EpisodeGroupCollector, load_reward_fn
from horizonrl.rollout.fixed_turn import FixedTurnCollector
from horizonrl.rollout.from_config import make_agent, make_engine, sampling_params
from horizonrl.train.checkpoint import (Checkpointer, ResumePoint, StopSignals, TrainingState, reference_policy,
                                        save_checkpoint)
from horizonrl.train.tasks import build_tiny_for_task, task_collector, task_warm_start
from horizonrl.train.warm_start import build_tiny_for_envs, format_warm_start


@dataclass
class RunContext:
    """One training run's objects. `critic`, `critic_opt` and `critic_loss` exist for ppo only.
    `first_iteration` is where the run starts: 0 (the critic warmup), 1, or after a resumed checkpoint.
    `rank` / `world_size`: this process among the run's processes (one process today)."""

    cfg: TrainConfig
    run_dir: Path
    device: torch.device
    tokenizer: PreTrainedTokenizerBase
    actor: PreTrainedModel
    reference: PreTrainedModel
    actor_opt: torch.optim.Optimizer
    actor_loss: LossFn
    engine: TrainingEngine
    collector: Collector
    metrics: MetricsSinks
    checkpointer: Checkpointer
    shuffle: torch.Generator          # mini-batch order
    first_iteration: int
    critic: ValueModel | None = None
    critic_opt: torch.optim.Optimizer | None = None
    critic_loss: LossFn | None = None
    rank: int = 0
    world_size: int = 1

    @property
    def pad_id(self) -> int:
        return pad_token_id(self.tokenizer)


def start_run(cfg: TrainConfig, envs: list, signals: StopSignals, resume: ResumePoint | None) -> RunContext:
    """Build the run's context: a new run folder, or the resumed run's with its checkpoint restored."""
    device = resolve_device(cfg.device)
    if resume is None:
        tokenizer, actor = build_policy(cfg, device)
        agent = make_agent(tokenizer, cfg.agent)
        if cfg.model.path is None and cfg.model.warm_start:
            if cfg.task is not None:
                task_warm_start(actor, tokenizer, cfg)
            else:
                format_warm_start(actor, agent, envs, cfg.model.warm_start, cfg.seed)
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
    actor_opt = torch.optim.AdamW(actor.parameters(), lr=cfg.actor.lr, weight_decay=cfg.optim.weight_decay)
    actor_loss = actor_loss_fn(actor, cfg.actor.clip_low, cfg.actor.clip_high, cfg.actor.dual_clip,
                               cfg.actor.entropy_coef, cfg.actor.loss_agg, cfg.rollout.temperature,
                               cfg.actor.kl_loss_coef, cfg.actor.tis_cap)
    shuffle = torch.Generator().manual_seed(cfg.seed)
    engine = make_engine(actor, tokenizer, cfg.rollout, cfg.seed, device, run_dir / "engine_weights")
    params = sampling_params(cfg.rollout, tokenizer, actor, agent)
    critic = critic_opt = critic_loss = None
    if cfg.algorithm == "ppo":
        collector = FixedTurnCollector(envs, agent, engine, params, cfg.ppo.e_len, cfg.seed)
        critic = ValueModel.from_policy(actor).eval()
        critic_opt = torch.optim.AdamW(critic.parameters(), lr=cfg.critic.lr, weight_decay=cfg.optim.weight_decay)
        critic_loss = critic_loss_fn(critic, cfg.critic.value_clip, cfg.critic.first_token_weight)
    elif cfg.task is not None:
        collector = task_collector(cfg, tokenizer, engine, params)
    else:
        collector = EpisodeGroupCollector(envs, cfg.env.ids[0], agent, engine, params, cfg.group.n_tasks,
                                          cfg.group.group_size, cfg.group.max_turns,
                                          load_reward_fn(cfg.group.reward_fn), cfg.seed)
    state = TrainingState(actor, tokenizer, actor_opt, shuffle, engine, collector, critic, critic_opt)
    if resume is not None:
        first_iteration = state.restore(resume.folder) + 1
    else:
        warmup = cfg.algorithm == "ppo" and cfg.critic.warmup_batches > 0 and cfg.critic.warmup_iters > 0
        first_iteration = 0 if warmup else 1
    metrics = MetricsSinks(run_dir, cfg.report_to, cfg.model_dump(mode="json"), first_iteration)
    return RunContext(cfg, run_dir, device, tokenizer, actor, reference, actor_opt, actor_loss, engine, collector,
                      metrics, Checkpointer(run_dir, state, cfg, signals), shuffle, first_iteration,
                      critic, critic_opt, critic_loss)


def build_policy(cfg: TrainConfig, device: torch.device) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
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
