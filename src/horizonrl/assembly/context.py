"""The run context: everything a training run builds once, before its first iteration.

    policy (loaded, or tiny + warm start; resuming: the initial one) -> engine (samples from the actor
    itself, or from a whole copy of its own) -> collector (fixed-turn for ppo, episode or task groups
    for the group algorithms, assembly/collectors.py; with rollout.async_training, played ahead by a producer
    thread, or a producer process with its own engine and envs: assembly/producer_process.py) ->
    critic (ppo) -> reference (a frozen copy; with model.lora, the actor with its adapters disabled,
    after adapters go on actor and critic) -> optimisers (over what trains) -> metrics sinks ->
    checkpointer (restores a resumed run's weights and state)

Under torchrun every rank builds the same context: rank 0 makes the run folder and holds the initial
policy in CPU memory, from which every rank fills its FSDP2 shards of actor, critic and reference
(learner/sharded_start.py: no rank holds a whole network on its device); each rank's collector plays
its share of the streams or tasks, and an hf engine samples from a whole copy of the policy of its own,
filled from the shards.

The iteration functions (train/loop.py) read and change only what the context holds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from horizonrl import envs as env_registry
from horizonrl import runfolder
from horizonrl.algos.losses import entropy_coef_at
from horizonrl.algos.rae import RoleBaselines
from horizonrl.config import MicroBatchBudget, TrainConfig, dump
from horizonrl.engines.base import TrainingEngine
from horizonrl.envs.pool import open_envs
from horizonrl.learner.device import autocast_dtype, resolve_device
from horizonrl.learner.distributed import LOCAL, Ranks
from horizonrl.learner.lora import AdaptersOff, add_adapters, lm_body, merged_parameters
from horizonrl.learner.models import ValueModel, engine_copy, frozen_copy, load_policy, pad_token_id
from horizonrl.learner.shared_prefix import UNSHARED, NetworkSharing, prefix_sharing
from horizonrl.learner.sharded_start import sharded_networks
from horizonrl.learner.update import LossFn, actor_loss_fn, critic_loss_fn
from horizonrl.plan import GIB, auto_token_budget
from horizonrl.report.sinks import MetricsSinks
from horizonrl.rollout.collector import Collector
from horizonrl.rollout.from_config import make_agent, make_engine, make_seat_opponent
from horizonrl.rollout.producer import Producer
from horizonrl.rollout.seat_opponents import NO_OPPONENT, SeatOpponent
from horizonrl.runstate.budget import Progress
from horizonrl.runstate.checkpoint import (Checkpointer, ResumePoint, StopSignals, TrainingState, initial_policy_path,
                                        save_checkpoint)
from horizonrl.assembly.collectors import make_collector
from horizonrl.assembly.producer_process import ProducerProcess
from horizonrl.assembly.sync_check import SyncCheck, served_by
from horizonrl.assembly.tasks import build_tiny_for_task, task_warm_start
from horizonrl.assembly.warm_start import build_tiny_for_envs, format_warm_start

log = logging.getLogger(__name__)


@dataclass
class RunContext:
    """One training run's objects. `critic`, `critic_opt` and `critic_loss` exist for ppo only.
    `first_iteration` is where the run starts: 0 (the critic warmup), 1, or after a resumed checkpoint.
    `ranks`: this process among the run's processes (torchrun); `metrics` is None except on rank 0.
    `micro_batch_budget`: what one forward/backward pass of the learner may hold (`micro_batch_budget`).
    `splits_explained`: the run was told why its merged rows split (train/phases.py explain_splits).
    `sharing`: with optim.shared_prefix, each network's prefix sharing and its counts (`network_sharing`).
    `sync_check`: the served-policy check after each weight sync (assembly/sync_check.py).
    `opponent`: who plays the seat of a self-play game the policy does not (`selfplay`, rollout/seat_opponents.py)."""

    cfg: TrainConfig
    run_dir: Path
    device: torch.device
    tokenizer: PreTrainedTokenizerBase
    actor: PreTrainedModel
    reference: PreTrainedModel | AdaptersOff
    actor_opt: torch.optim.Optimizer
    engine: TrainingEngine
    sync_check: SyncCheck
    collector: Collector
    metrics: MetricsSinks | None
    checkpointer: Checkpointer
    shuffle: torch.Generator          # mini-batch order
    micro_batch_budget: MicroBatchBudget
    first_iteration: int
    critic: ValueModel | None = None
    critic_opt: torch.optim.Optimizer | None = None
    critic_loss: LossFn | None = None
    ranks: Ranks = LOCAL
    splits_explained: bool = False
    sharing: NetworkSharing = UNSHARED
    opponent: SeatOpponent = NO_OPPONENT

    @property
    def progress(self) -> Progress:
        """What the run has spent (runstate/budget.py), saved with its checkpoints."""
        return self.checkpointer.state.progress

    @property
    def role_baselines(self) -> RoleBaselines:
        """RAE's baseline of each game and seat (algos/rae.py), saved with its checkpoints."""
        return self.checkpointer.state.role_baselines

    @property
    def pad_id(self) -> int:
        return pad_token_id(self.tokenizer)

    def entropy_coef(self, iteration: int) -> float:
        actor = self.cfg.actor
        return entropy_coef_at(actor.entropy_coef, actor.entropy_decay, iteration, self.cfg.iterations)

    def actor_loss(self, iteration: int) -> LossFn:
        """The actor's loss of update `iteration` (its entropy bonus: `entropy_coef`)."""
        cfg = self.cfg
        return actor_loss_fn(self.actor, cfg.actor.clip_low, cfg.actor.clip_high, cfg.actor.dual_clip,
                             self.entropy_coef(iteration), cfg.actor.loss_agg, cfg.rollout.temperature,
                             cfg.actor.kl_loss_coef, cfg.actor.tis_cap, cfg.actor.tis_mode, self.sharing.actor)


def start_run(cfg: TrainConfig, envs: list, signals: StopSignals, resume: ResumePoint | None,
              ranks: Ranks = LOCAL, device: torch.device | None = None) -> RunContext:
    """Build the run's context: a new run folder, or the resumed run's with its checkpoint restored."""
    device = device or resolve_device(cfg.device)
    policy_device = torch.device("cpu") if ranks.distributed else device     # learner/sharded_start.py
    if resume is None:
        run_dir, tokenizer, policy = new_run(cfg, envs, ranks, policy_device, signals)
    else:                                   # the initial policy; the checkpoint's weights come over it
        run_dir = resume.run_dir
        tokenizer, policy = load_policy(initial_policy_path(cfg, run_dir), policy_device) if ranks.is_main \
            else (None, None)
    tokenizer = ranks.broadcast(tokenizer)
    if ranks.distributed:
        actor, critic, reference = sharded_networks(cfg, policy, ranks, device)
        del policy                          # rank 0's whole copy goes before the engine's comes
        sampled = engine_copy(actor, autocast_dtype(device) or torch.float32, device) \
            if cfg.rollout.engine_spec.samples_learner_module else actor
    else:
        actor, critic, reference, sampled = local_networks(cfg, policy, device)
    opponent = NO_OPPONENT                               # a producer process has none (config.py)
    if cfg.rollout.async_training.in_a_process:          # the engine and envs are the producer process's
        collector = ProducerProcess(cfg, tokenizer, sampled, ranks)
        engine = collector.engine
    else:
        wrapped = ranks.distributed or cfg.model.lora is not None     # the actor's state dict is no plain model's
        loads_tensors = wrapped and not cfg.rollout.engine_spec.samples_learner_module
        engine = make_engine(sampled, tokenizer, cfg.rollout, cfg.seed, device, run_dir / runfolder.ENGINE_WEIGHTS,
                             merged_parameters(actor) if loads_tensors else None)
        opponent = make_seat_opponent(cfg, tokenizer, actor, device)
        collector = make_collector(cfg, tokenizer, engine, sampled, envs, ranks, opponent)
        if cfg.rollout.async_training.max_staleness:   # an hf engine samples from a copy of its own
            collector = Producer(collector, cfg.rollout.async_training.max_staleness,
                                 lambda: engine.weights_version, lambda: engine.in_flight_at_sync)
    sharing = network_sharing(cfg, actor, critic, reference, ranks)
    critic_opt = critic_loss = None
    actor_opt = adamw(trainable(actor), cfg.actor.lr, cfg.optim.weight_decay)
    if critic is not None:
        critic_opt = adamw(trainable(critic), cfg.critic.lr, cfg.optim.weight_decay)
        critic_loss = critic_loss_fn(critic, cfg.critic.value_clip, cfg.critic.first_token_weight, sharing.critic)
    shuffle = torch.Generator().manual_seed(cfg.seed)
    sync_check = SyncCheck(served_by(cfg), **cfg.rollout.sync_check.model_dump(), ranks=ranks, sharing=sharing.actor)
    state = TrainingState(actor, tokenizer, actor_opt, shuffle, engine, collector, sync_check, critic, critic_opt,
                          ranks, role_baselines=RoleBaselines(cfg.rae.decay), opponent=opponent)
    if resume is not None:
        first_iteration = state.restore(resume.folder) + 1
    else:
        warmup = cfg.algorithm_spec.critic and cfg.critic.warmup_batches > 0 and cfg.critic.warmup_iters > 0
        first_iteration = 0 if warmup else 1
    metrics = MetricsSinks(run_dir, cfg.report_to, cfg.model_dump(mode="json"), first_iteration) \
        if ranks.is_main else None
    return RunContext(cfg, run_dir, device, tokenizer, actor, reference, actor_opt, engine, sync_check, collector,
                      metrics, Checkpointer(run_dir, state, cfg, signals), shuffle,
                      micro_batch_budget(cfg, device, ranks.world_size,
                                         None if sharing.actor is None else sharing.actor.window),
                      first_iteration,
                      critic, critic_opt, critic_loss, ranks, sharing=sharing, opponent=opponent)


def network_sharing(cfg: TrainConfig, actor, critic: ValueModel | None, reference, ranks: Ranks) -> NetworkSharing:
    """With optim.shared_prefix, the prefix sharing of each network's body (a LoRA reference is its actor's body with
    the adapters off, so shares the actor's Sharing); without it, none."""
    if not cfg.optim.shared_prefix:
        return UNSHARED
    actor_sharing = prefix_sharing(lm_body(actor), ranks=ranks)
    critic_sharing = None if critic is None else prefix_sharing(critic.backbone, ranks=ranks)
    if isinstance(reference, AdaptersOff):
        return NetworkSharing(actor_sharing, actor_sharing, critic_sharing)
    reference_sharing = None if reference is None else prefix_sharing(lm_body(reference), ranks=ranks)
    return NetworkSharing(actor_sharing, reference_sharing, critic_sharing)


def micro_batch_budget(cfg: TrainConfig, device: torch.device, gpus: int, window: int | None = None
                       ) -> MicroBatchBudget:
    """optim's micro-batches: micro_batch_size rows, or a token budget. max_tokens_per_micro_batch=auto is, on
    CUDA, the largest budget the planner says fits this GPU's memory (`plan.with_auto_budget`, logged), and on a
    CPU none (micro_batch_size rows: the budget of before, and a CPU run's memory is not the planner's).
    `window`: the attention window of the bodies that share prefixes (learner/shared_prefix.attention_window)."""
    tokens = cfg.optim.max_tokens_per_micro_batch
    if tokens == "auto":
        tokens = None
        if device.type == "cuda":
            gpu_bytes = torch.cuda.get_device_properties(device).total_memory
            tokens = auto_token_budget(cfg, gpus, gpu_bytes)
            log.info("micro-batches of at most %d tokens (optim.max_tokens_per_micro_batch=auto: the largest budget "
                     "`horizonrl plan` fits in %.1f GiB on %d GPU%s)", tokens, gpu_bytes / GIB, gpus, "s" * (gpus > 1))
    return MicroBatchBudget(cfg.optim.micro_batch_size, tokens, cfg.optim.shared_prefix, window)


def local_networks(cfg: TrainConfig, actor: PreTrainedModel, device: torch.device
                   ) -> tuple[PreTrainedModel, ValueModel | None, PreTrainedModel | AdaptersOff, PreTrainedModel]:
    """(actor, critic (ppo), reference, the model the engine samples from) of a one-process run: the
    critic and the reference copies of the policy, or with LoRA adapters on actor and critic and the
    reference the actor with its adapters disabled (the hf engine then samples from a merged copy, as it
    does in asynchronous training, while the actor updates).
    Every network in eval mode: dropout off, so the sampler and the learner compute the same function."""
    actor.eval()
    own_copy = cfg.model.lora is not None or cfg.rollout.async_training.max_staleness
    sampled = engine_copy(actor, autocast_dtype(device) or torch.float32, device) \
        if cfg.rollout.engine_spec.samples_learner_module and own_copy else actor
    critic = ValueModel.from_policy(actor).eval() if cfg.algorithm_spec.critic else None
    if cfg.model.lora is None:
        return actor, critic, frozen_copy(actor), sampled
    actor, critic = add_adapters(actor, critic, cfg.model.lora, cfg.seed)
    return actor, critic, AdaptersOff(actor), sampled


def new_run(cfg: TrainConfig, envs: list, ranks: Ranks, device: torch.device, signals: StopSignals
            ) -> tuple[Path, PreTrainedTokenizerBase, PreTrainedModel]:
    """(run folder, tokenizer, policy) of a new run: the policy from `model.path`, or a tiny model
    (warm-started as the config says) saved in run_dir/init. Under torchrun rank 0 builds the policy and
    makes the folder, warm-starting on every stream of the run as one process does (so the tiny model
    does not depend on the world size; `envs` are those streams, or none when a producer process opens
    them: then the warm start opens its own); the other ranks get (run folder, None, None): their shards come
    from rank 0's policy (learner/sharded_start.py). A stop signal ends the building of the policy (the
    warm start) within seconds, before the run folder is made (`signals.within`)."""
    if ranks.is_main:
        warm = cfg.model.path is None and cfg.model.warm_start
        with signals.within("the warm start" if warm else "the start-up"):
            tokenizer, actor = build_policy(cfg, device, signals.check)
            if warm and cfg.task is not None:
                task_warm_start(actor, tokenizer, cfg, signals.check)
            elif warm:
                every_stream = open_envs(cfg.env.ids, cfg.env.kwargs, cfg.rollout.n_env, cfg.env.workers,
                                         cfg.env.timeout_s) if ranks.distributed or not envs else envs
                try:
                    format_warm_start(actor, make_agent(tokenizer, cfg.agent), every_stream, cfg.model.warm_start,
                                      cfg.seed, signals.check)
                finally:
                    if every_stream is not envs:
                        for env in every_stream:
                            env.close()
        run_dir = make_run_dir(cfg)
        if cfg.model.path is None:
            save_checkpoint(run_dir / runfolder.INIT, actor, tokenizer)
    else:
        tokenizer = actor = None
    return ranks.broadcast(run_dir if ranks.is_main else None), tokenizer, actor


def trainable(model: nn.Module) -> list[nn.Parameter]:
    """The parameters an optimizer steps: all of them, or the adapters (and value head) of a LoRA run."""
    return [p for p in model.parameters() if p.requires_grad]


def adamw(params: list[nn.Parameter], lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over `params`: fused (one kernel per step) where they all live on CUDA, where torch's default is its
    multi-kernel foreach implementation; elsewhere torch's default (on a CPU, or with dist.cpu_offload)."""
    on_cuda = bool(params) and all(p.device.type == "cuda" for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True if on_cuda else None)


def build_policy(cfg: TrainConfig, device: torch.device, check: Callable[[], None] = lambda: None
                 ) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """(tokenizer, policy): loaded from `model.path`, else a tiny model for the task (`check()` between the
    batches of teacher conversations its tokenizer learns from: it raises to stop) or the env(s)."""
    if cfg.model.path is not None:
        return load_policy(cfg.model.path, device)
    if cfg.task is not None:
        return build_tiny_for_task(cfg, device, check)
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
    (run_dir / runfolder.CONFIG).write_text(dump(cfg))
    return run_dir
