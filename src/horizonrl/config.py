"""Typed run configuration: YAML recipe + dotted `key=value` overrides, validated by pydantic.

Sections say which algorithm reads them. Every algorithm: model, env (or task), agent, rollout,
optim (the optimiser steps), actor (its learning rate and policy loss), samples/merge, checkpointing
(save_every) and report_to. PPO only: ppo (fixed-turn batches, GAE, KL in the reward) and critic.
Group algorithms only (grpo, dr_grpo, rloo, reinforce_pp, gigpo and rae: `algos/registry.py`): group;
gigpo also reads gigpo (its step-level advantage; every env must have state_key()), rae reads rae, and
selfplay (an opponent model or pool in one seat) is read for self-play games. Settings an algorithm does not
read are no error, and a cross-field check runs only for the algorithm it is
about. `actor.kl_loss_coef` (KL in the actor loss) works with every algorithm, ppo included.

A wrong key, type or value is one `ConfigError` whose message names the key, e.g.
    actor.clip_low: Input should be a valid number (got 'abc')
    optim.mini_batch_size: 100 does not divide the rollout.n_env * ppo.e_len = 256 turns of a PPO batch
    env.ids: unknown key; did you mean env.id?
    ppo.mini_batch_size moved to optim.mini_batch_size         (a key of the earlier layout: MOVED)
Validated: every count and size (each has a lower bound); options that contradict each other or would
do nothing (samples=merged with a window history merges nothing: an error, not a warning); and what
the config names: the env id and its kwargs (one env is built to check their values), the
"module:attribute" references of `task` and `group.reward_fn` (imported). `model.path` is checked
where it is loaded (learner/models.load_policy).
"""

from __future__ import annotations

import difflib
import importlib.util
import typing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, ValidationError,
                      ValidationInfo, model_validator)

from horizonrl import runfolder
from horizonrl.algos.registry import ALGORITHMS, AlgorithmSpec, Batches, algorithm
from horizonrl.engines.registry import ENGINES, EngineSpec, engine
from horizonrl.errors import ConfigError

SINKS = ("jsonl", "tensorboard", "wandb")   # where each iteration's metrics go (report/sinks.py)
MOVED = {  # keys of earlier layouts -> their place now
    **{f"ppo.{key}": f"optim.{key}" for key in ("weight_decay", "grad_clip", "epochs", "mini_batch_size",
                                                "micro_batch_size", "max_tokens_per_micro_batch")},
    **{f"ppo.{key}": f"actor.{key}" for key in ("clip_low", "clip_high", "dual_clip", "entropy_coef",
                                                "kl_loss_coef", "loss_agg")},
    **{f"ppo.{key}": f"critic.{key}" for key in ("value_clip", "first_token_weight", "warmup_batches",
                                                 "warmup_iters")},
    "ppo.actor_lr": "actor.lr", "ppo.tis_cap": "actor.tis_cap", "ppo.critic_lr": "critic.lr",
    "rollout.e_len": "ppo.e_len",
}
PACKAGE_CONFIGS = Path(__file__).parent / "configs"        # recipes inside an installed wheel
SOURCE_CONFIGS = Path(__file__).resolve().parents[2] / "configs"  # recipes in a source checkout
DEFAULT_RECIPE = "babyai_tiny.yaml"


class InvalidKey(ValueError):
    """Raised by a section's model validator about one of its keys (`key`: dotted, relative to the
    section), so that the message names that key (model.warm_start) and not only the section (model)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def _import_target(reference: str) -> str:
    """`reference` itself once "module:attribute" imports; ValueError saying why it does not."""
    from horizonrl.tools.registry import import_target

    import_target(reference)
    return reference


def _tool_references(references: list[str]) -> list[str]:
    """`references` once every tool they name loads; ValueError naming the one that does not."""
    from horizonrl.tools.registry import tools_from_references

    tools_from_references(references)
    return references


Importable = Annotated[str, AfterValidator(_import_target)]


def parse_threads(value: Any) -> int | str:
    """A `threads` setting: "auto", or a whole number > 0 (an int, or its text: HORIZONRL_THREADS=2);
    ValueError otherwise."""
    if value == "auto":
        return value
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise ValueError(f"must be auto or a number of threads > 0, got {value!r}")


Threads = Annotated[Annotated[int, Field(gt=0)] | Literal["auto"], BeforeValidator(parse_threads)]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TinyModel(Section):
    """A Llama-architecture model built from scratch, with a BPE tokenizer trained on the env's text."""

    vocab_size: int = Field(1024, gt=0)
    hidden_size: int = Field(64, gt=0)
    num_layers: int = Field(2, gt=0)
    num_heads: int = Field(4, gt=0)
    num_kv_heads: int = Field(2, gt=0)
    intermediate_size: int = Field(192, gt=0)
    max_position_embeddings: int = Field(2048, gt=0)

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModel:
        if self.hidden_size % self.num_heads:
            raise InvalidKey("num_heads", f"{self.num_heads} does not divide hidden_size = {self.hidden_size}")
        if self.num_heads % self.num_kv_heads:
            raise InvalidKey("num_kv_heads", f"{self.num_kv_heads} does not divide num_heads = {self.num_heads}")
        return self


class WarmStart(Section):
    """Supervised warm-up on format-correct, uniformly random actions (stands in for an instruct model)."""

    iterations: int = Field(4, gt=0, description="fixed-turn batches of demonstrations to collect")
    turns: int = Field(8, gt=0, description="turns each env stream plays per demonstration batch")
    steps: int = Field(200, ge=0)
    batch_size: int = Field(32, gt=0)
    lr: float = Field(3e-3, gt=0)


class LoRAConfig(Section):
    """Low-rank adapters (PEFT) on the actor's and the critic's linear layers; the base weights stay frozen
    and the reference policy is the actor with its adapters disabled (no second copy of the weights)."""

    r: int = Field(16, gt=0, description="adapter rank")
    alpha: float = Field(32.0, gt=0, description="scale: the update is alpha / r * B @ A")
    dropout: float = Field(0.0, ge=0, lt=1, description="must be 0: actor and critic run in eval mode")
    target_modules: list[str] | Literal["all-linear"] = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="names of the linear layers that get adapters (PEFT's target_modules)")

    @model_validator(mode="after")
    def _no_dropout(self) -> LoRAConfig:
        """The trainer keeps its networks in eval mode, so that the sampler and the learner compute the same
        function (assembly/context.py): adapter dropout would never act."""
        if self.dropout:
            raise InvalidKey("dropout", f"{self.dropout}: the trainer runs actor and critic in eval mode (the "
                                        "sampler and the learner compute the same function), so adapter dropout "
                                        "never acts; leave it 0")
        return self


class ModelConfig(Section):
    path: str | None = Field(None, description="Hugging Face id or local folder; None builds `tiny`")
    tiny: TinyModel = TinyModel()
    warm_start: WarmStart | None = None
    lora: LoRAConfig | None = Field(None, description="train low-rank adapters instead of every weight")

    @model_validator(mode="after")
    def _warm_start_needs_tiny(self) -> ModelConfig:
        if self.path is not None and self.warm_start is not None:
            raise InvalidKey("warm_start", "trains the tiny model from scratch; set it to null with model.path")
        return self


class EnvConfig(Section):
    id: str | list[str] = Field("river", description="an env id, or a list of them: stream i plays ids[i % len(ids)]")
    kwargs: dict[str, Any] = Field({}, description="constructor arguments, given to every env id")
    workers: bool = Field(False, description="run each env stream in its own worker process")
    timeout_s: float = Field(60.0, gt=0, description="an env call in a worker slower than this is restarted")

    @model_validator(mode="after")
    def _known_envs_and_kwargs(self) -> EnvConfig:
        from horizonrl.envs import check_kwargs, factory

        if not self.ids:
            raise InvalidKey("id", "an empty list names no env")
        try:
            for env_id in self.ids:
                factory(env_id)  # an unknown id, or a package the env needs is missing
        except ValueError as error:
            raise InvalidKey("id", str(error)) from None
        try:
            for env_id in self.ids:
                check_kwargs(env_id, self.kwargs)
        except ValueError as error:
            raise InvalidKey("kwargs", str(error)) from None
        return self

    @property
    def ids(self) -> list[str]:
        """The env ids as a list (one for a single id)."""
        return [self.id] if isinstance(self.id, str) else list(self.id)


class AgentConfig(Section):
    memory: int = Field(1, ge=0, description="past turns shown in the prompt (history = window)")
    history: Literal["window", "full"] = Field(
        "window", description="window: the last `memory` turns as messages; full: the whole conversation, "
                              "token-exact")
    feedback: Literal["new_round", "continuation"] = Field(
        "new_round", description="history = full: each observation a new user message (new_round) or appended "
                                 "inside the assistant message, which the model continues (continuation)")
    invalid_penalty: float = -0.1
    translations: dict[str, str] = {}

    @model_validator(mode="after")
    def _continuation_needs_full_history(self) -> AgentConfig:
        from horizonrl.agents.agent import check_feedback

        try:
            check_feedback(self.history, self.feedback)
        except ValueError as error:
            raise InvalidKey("feedback", str(error)) from None
        return self


class VLLMOptions(Section):
    """rollout.engine = vllm: an in-process `vllm.LLM` over a copy of the actor's weights, synced in place."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto: what the hf engine samples in (bfloat16 on a GPU, float32 on the CPU)")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="share of GPU memory (on the CPU: of the NUMA node's memory) for vLLM; "
                                      "None: 0.5 on a GPU (the learner shares it), 0.2 on the CPU")
    tensor_parallel_size: int = Field(1, gt=0)
    enable_prefix_caching: bool = True
    max_num_seqs: int | None = Field(None, gt=0, description="None: rollout.max_batch_size")
    max_model_len: int | None = Field(None, gt=0, description="None: the model's max_position_embeddings")
    enable_sleep_mode: bool = Field(False, description="GPU: free vLLM's memory during the update (a no-op on CPU)")
    enforce_eager: bool = Field(
        False, description="skip vLLM's torch.compile of the model: a start-up ~50 s shorter on a CPU, a decode "
                           "up to ~20% slower (docs/engines.md); for short runs and tests")
    weights_dir: str | None = Field(
        None, description="where the engine's copy of the weights is written, rewritten after every update and "
                          "reloaded (a subfolder rank<R> per rank; up to the model's size in `dtype` each); None: "
                          "the run folder's engine_weights/ (eval: a temporary folder)")


class OpenAIOptions(Section):
    """rollout.engine = openai: a running OpenAI-compatible server that returns token ids (vLLM, SGLang)."""

    base_url: str = Field("http://127.0.0.1:8000/v1", description="the server's /v1 URL")
    api_key: str | None = Field(None, description="None: $OPENAI_API_KEY, if set")
    model: str | None = Field(None, description="the served model's name; None: the first of /v1/models")
    timeout_s: float = Field(300.0, gt=0, description="one request's time limit")
    weights_dir: str | None = Field(
        None, description="train: where the learner writes the weights for the server to reload (a folder "
                          "the server can read); None: the run folder's engine_weights/")


class AsyncTrainingConfig(Section):
    """Rollouts overlap the update (rollout/producer.py): a producer keeps collecting the next batches while the
    learner trains on the last one. A batch never holds a turn sampled more than `max_staleness` weight syncs
    before the policy it trains (the producer starts batch b only once the learner has asked for batch
    b - max_staleness); 0: collect, then train, as one loop (no producer)."""

    max_staleness: int = Field(0, ge=0, description="K: weight versions a trained turn may lag the policy being "
                                                    "updated; 0: synchronous (rollout, then update)")
    producer: Literal["thread", "process"] = Field(
        "thread", description="where the producer runs with the hf engine: a thread of the learner's process, or a "
                              "process of its own with its own copy of the policy (assembly/producer_process.py); the "
                              "vllm and openai engines generate in a process of their own already")

    @property
    def in_a_process(self) -> bool:
        """Whether a producer process plays the rollouts (K >= 1 and `producer: process`)."""
        return self.max_staleness > 0 and self.producer == "process"


class SyncCheckConfig(Section):
    """After each weight sync, the engine and the learner score the same probe rows of the first batch: a run whose
    gap grows past max(max_growth x the gap before the first update, min_gap) stops, naming the engine and the gap
    (a stale or partial sync; assembly/sync_check.py)."""

    max_growth: float | None = Field(4.0, gt=1, description="how many times the gap on the same weights (before the "
                                                            "first update) a gap after a sync may reach; null: no "
                                                            "check")
    min_gap: float = Field(1e-3, gt=0, description="a gap (nats per token) below this never stops the run")
    probe_rows: int = Field(4, gt=0, description="rows of the first batch that both sides score after each sync")


class RolloutConfig(Section):
    n_env: int = Field(16, gt=0, description="env streams (ppo) or env handles shared by the group rollouts")
    max_tokens: int = Field(32, gt=0)
    temperature: float = Field(1.0, ge=0, description="> 0: the learner scores the tokens at this temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="1: the learner scores the full softmax, not a nucleus")
    engine: Literal[ENGINES] = Field(
        "hf", description="; ".join(f"{name}: {engine(name).description}" for name in ENGINES))
    max_batch_size: int = Field(256, gt=0)
    prefix_cache_tokens: int = Field(65536, ge=0, description="hf: KV of ended sequences kept for prompts that "
                                                              "extend them")
    decode_step: Literal["auto", "dynamic", "static", "graph"] = Field(
        "auto", description="hf: a decode step over the cache's filled part (dynamic), or at fixed shapes "
                            "replayed as a CUDA graph (graph) or rerun eagerly (static); auto: graph on CUDA")
    vllm: VLLMOptions = VLLMOptions()
    openai: OpenAIOptions = OpenAIOptions()
    async_training: AsyncTrainingConfig = AsyncTrainingConfig()
    sync_check: SyncCheckConfig = SyncCheckConfig()

    @model_validator(mode="after")
    def _learner_scores_the_sampling_distribution(self) -> RolloutConfig:
        """The learner scores every sampled token under softmax(logits / temperature) over the whole
        vocabulary, and the engines report the log-prob under the distribution they sample from. The two
        agree only for temperature > 0 and top_p = 1: at temperature 0 the learner's log-probs are NaN (every
        update skipped); under top_p < 1 the engine's log-prob is renormalised over the nucleus, so every
        token's TIS weight exp(logp_old - logp_engine) is its nucleus mass and `rollout/logprob_abs_diff`
        reads truncation as mismatch. (`horizonrl eval` samples greedily with its own temperature 0.)"""
        if self.temperature == 0:
            raise InvalidKey("temperature", "0 is greedy decoding, which training cannot score (the learner's "
                                            "log softmax(logits / 0) is NaN, so every update would be skipped); "
                                            "set a temperature > 0 (horizonrl eval has its own greedy mode)")
        if self.top_p < 1:
            raise InvalidKey("top_p", f"{self.top_p} < 1: the engines report log-probs renormalised over the "
                                      "nucleus while the learner scores the full softmax, so the TIS weights and "
                                      "rollout/logprob_abs_diff would read the nucleus mass as engine/learner "
                                      "mismatch; train with top_p = 1 (lower the temperature to sample less "
                                      "widely)")
        return self

    @property
    def engine_spec(self) -> EngineSpec:
        """What `engine` is (its row of engines/registry.py)."""
        return engine(self.engine)

    @model_validator(mode="after")
    def _producer_process_plays_the_hf_engine(self) -> RolloutConfig:
        if self.async_training.producer == "process" and not self.engine_spec.samples_learner_module:
            raise InvalidKey("async_training.producer", f"process runs the hf engine in a producer process; the "
                                                        f"{self.engine} engine already generates in a process of its "
                                                        "own: use thread")
        return self

    @model_validator(mode="after")
    def _engine_installed(self, info: ValidationInfo) -> RolloutConfig:
        """Unless the config is only read here (`horizonrl plan`: load_config(..., runs_here=False))."""
        runs_here = (info.context or {}).get("runs_here", True)
        package = self.engine_spec.package
        if package is not None and runs_here and importlib.util.find_spec(package) is None:
            raise InvalidKey("engine", f"{self.engine} needs the {package} package: {self.engine_spec.install}")
        return self


@dataclass(frozen=True)
class MicroBatchBudget:
    """What one forward/backward pass may hold: `rows` rows, or, when `tokens` is set, rows x longest
    row <= tokens (see `learner.scoring.pack_rows`). `shared_prefix` (optim.shared_prefix): the rows are
    packed in the order of their tokens, so that rows sharing a prefix share a micro-batch, and `tokens` bounds
    the token slots of each micro-batch's two passes (`learner.scoring.pack_shared_rows`); `window`: the model's
    attention window, which those passes respect (`learner.shared_prefix.attention_window`)."""

    rows: int
    tokens: int | None = None
    shared_prefix: bool = False
    window: int | None = None

    def halved(self) -> MicroBatchBudget:
        """Half the token budget, or half the rows when there is none (never below 1)."""
        if self.tokens is None:
            return replace(self, rows=max(1, self.rows // 2))
        return replace(self, tokens=max(1, self.tokens // 2))


class OptimConfig(Section):
    """How every algorithm steps its optimisers (AdamW): mini-batches, micro-batches, clipping."""

    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    epochs: int = Field(1, gt=0, description="passes over each batch")
    mini_batch_size: int = Field(128, gt=0, description="rows per optimizer step")
    micro_batch_size: int = Field(32, gt=0, description="rows per forward/backward pass")
    max_tokens_per_micro_batch: Annotated[int, Field(gt=0)] | Literal["auto"] | None = Field(
        "auto", description="rows x longest row per forward/backward pass; replaces micro_batch_size when set. "
                            "auto: on CUDA the largest budget that `horizonrl plan` says fits the GPU's memory, on "
                            "a CPU none (assembly/context.micro_batch_budget)")
    shared_prefix: bool = Field(
        False, description="rows of a micro-batch that share a prefix of at least 32 tokens run it once "
                           "(learner/shared_prefix.py: the plain forward's values up to summation order); not "
                           "with dist.activation_checkpointing")


class ActorConfig(Section):
    """The policy update of every algorithm: PPO's clipped surrogate, an entropy bonus and an optional
    k3 KL-to-reference loss (GRPO's beta)."""

    lr: float = Field(1e-6, gt=0)
    clip_low: float = Field(0.2, ge=0)
    clip_high: float = Field(0.2, ge=0)
    dual_clip: float | None = Field(3.0, gt=1)
    entropy_coef: float = 0.001
    entropy_decay: Literal["constant", "linear"] = Field(
        "constant", description="linear: the entropy bonus at iteration i is entropy_coef x (1 - (i - 1) / "
                                "iterations), from entropy_coef at the first update towards 0 at the last "
                                "(algos/losses.py entropy_coef_at); a run its budget stops early stops short of 0")
    kl_loss_coef: float = Field(0.0, ge=0, description="k3 KL to the reference in the actor loss (GRPO's beta)")
    loss_agg: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = "token-mean"
    tis_cap: float | None = Field(
        None, gt=0, description="truncated importance sampling: each token's policy-gradient term weighted by "
                                "min(exp(logp_old - logp_engine), tis_cap); None: off")
    tis_mode: Literal["truncate", "mask"] = Field(
        "truncate", description="a token whose exp(logp_old - logp_engine) exceeds tis_cap: truncate: weighted "
                                "tis_cap; mask: weighted 0 (out of the policy gradient), the others by the exact ratio")


class PPOConfig(Section):
    """PPO only: fixed-turn batches, token rewards (KL to the reference in the reward) and dual-discount GAE."""

    e_len: int = Field(8, gt=0, description="turns each env stream plays per batch (Verlog's fixed-turn batching)")
    gamma_step: float = Field(0.99, ge=0, le=1)
    lambda_step: float = Field(0.95, ge=0, le=1)
    gamma_token: float = Field(1.0, ge=0, le=1)
    lambda_token: float = Field(1.0, ge=0, le=1)
    whiten_advantages: bool = True
    kl_coef: float = Field(0.001, ge=0, description="KL to the reference as a token reward")
    kl_estimator: Literal["k1", "k2", "k3"] = "k1"


class CriticConfig(Section):
    """PPO only: the value model, its clipped loss and its warmup before the actor moves."""

    lr: float = Field(1e-5, gt=0)
    value_clip: float | None = Field(0.5, gt=0)
    first_token_weight: float = Field(3.0, ge=0, description="weight of each turn's first value (the prompt's)")
    warmup_batches: int = Field(4, ge=0, description="batches collected for critic warmup")
    warmup_iters: int = Field(5, ge=0, description="critic-only passes over the warmup batches")


class MergeConfig(Section):
    """Limits and diagnostics of prefix-merged rows (samples = merged)."""

    max_prompt_len: int | None = Field(None, gt=0, description="the first prompt of a row")
    max_response_len: int | None = Field(None, gt=0, description="everything after it; longer -> a new row")
    debug: bool = Field(False, description="write every prefix mismatch to merge_mismatches.jsonl in the run folder")


class GroupConfig(Section):
    """Group algorithms only (grpo, dr_grpo, rloo, reinforce_pp, gigpo, rae; the estimator is `algorithm`):
    episode groups of one task, scored by an outcome reward."""

    n_tasks: int = Field(8, gt=0, description="tasks (env seeds) per batch")
    group_size: int = Field(8, gt=1, description="rollouts per task")
    max_turns: int = Field(32, gt=0, description="turns after which an episode is truncated")
    reward_fn: Importable | None = Field(None, description='"module:function" taking an Episode; None: its return')


class GiGPOConfig(Section):
    """algorithm=gigpo only: the step-level advantage added to the episode's (algos/gigpo.py)."""

    gamma: float = Field(0.95, ge=0, le=1, description="discount of the step returns")
    step_weight: float = Field(1.0, ge=0, description="weight of the step advantage")
    norm: Literal["std", "none"] = Field("std", description="std: (x - mean) / (std + eps); none: x - mean")


class RAEConfig(Section):
    """algorithm=rae only: the moving baseline of each role (algos/rae.py), saved with the run's checkpoints."""

    decay: float = Field(0.95, ge=0, lt=1, description="b <- decay * b + (1 - decay) * the batch's mean return")
    per_seat: bool = Field(True, description="a baseline per game and seat; false: one per game, whatever the seat "
                                             "(no role conditioning: the ablation)")


class SelfPlayConfig(Section):
    """Self-play games (env.kwargs.opponent: self) with a group algorithm: who plays the seat the trained policy does
    not (rollout/seat_opponents.py): the policy plays seat seed % 2, the opponent the other, and only the policy's
    seats are trained. Neither set: the policy plays every seat."""

    opponent_model: str | None = Field(None, description="a model folder with the policy's tokenizer (a warm start, "
                                                         "a checkpoint) that plays the other seat")
    opponent_url: str | None = Field(None, description="the /v1 URL of an OpenAI-compatible server returning token "
                                                       "ids (vLLM, horizonrl gateway) whose model, with the policy's "
                                                       "tokenizer, plays the other seat")
    pool_size: int = Field(0, ge=0, description="> 0: a pool of the policy's past snapshots plays the other seat "
                                                "(the initial policy first; one member drawn each iteration)")
    snapshot_every: int = Field(5, gt=0, description="iterations between the snapshots that join the pool")


class SFTConfig(Section):
    """`horizonrl sft`: supervised fine-tuning on expert demonstrations (the env's expert_action)."""

    episodes: int = Field(256, gt=0, description="expert episodes to demonstrate, per env id")
    max_turns: int = Field(128, gt=0, description="turns after which a demonstration is cut")
    steps: int = Field(500, ge=0)
    batch_size: int = Field(32, gt=0)
    lr: float = Field(3e-3, gt=0)
    lr_decay: Literal["constant", "cosine"] = Field(
        "constant", description="cosine: step s of the steps learns at lr x (1 + cos(pi x (s - 1) / steps)) / 2, "
                                "from lr towards 0 (learner/sft.py sft_lr_factor)")
    expert_noise: float = Field(0.0, ge=0, lt=1, description=(
        "probability that a demonstration turn takes a random other action the expert recovers from "
        "(DART, Laskey et al. 2017): those turns are not learned from, the expert's next ones show recovery"))


class TaskConfig(Section):
    """A tool-use or interaction task for the agent loop, instead of a game env (needs a group algorithm;
    `group.max_turns` bounds the responses, `group.reward_fn` scores the episode)."""

    source: Importable = Field(description='"module:function" giving the Task for a seed')
    tools: Annotated[list[str], AfterValidator(_tool_references)] = Field(
        [], description='"module:name" of a Tool or function, or a tools YAML file')
    interaction: Importable | None = Field(None, description='"module:Class" of an Interaction or MultiTurnScheduler')
    teacher: Importable | None = Field(None, description='"module:function" (tasks) -> responder, for the tiny '
                                                        'warm start')
    feedback: Literal["new_round", "continuation"] = "new_round"
    max_total_tokens: int = Field(1024, gt=0, description="tokens after the first prompt (responses + feedback)")
    max_parallel_calls: int = Field(4, gt=0)
    tool_timeout_s: float = Field(10.0, gt=0)
    max_tool_response_tokens: int = Field(256, gt=0)
    agent: Importable | None = Field(None, description='"module:function" or "file.py:function": an `async def '
                                                       'agent(task: dict, base_url: str) -> float | None` calling '
                                                       'the OpenAI API at base_url, trained through the gateway '
                                                       '(gateway/agent_groups.py) instead of the agent loop')
    agent_timeout_s: float = Field(300.0, gt=0, description="an agent running longer is stopped and dropped")
    agents: list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]+$")]] = Field(
        [], description="the names of the agents of a program of several (task.agent): each calls on its own URL "
                        "(gateway/agent_groups.py agent_url) and is trained on its own calls and reward")

    @model_validator(mode="after")
    def _agent_runs_its_own_tools(self) -> TaskConfig:
        if self.agent is not None and (self.tools or self.interaction is not None):
            raise InvalidKey("agent", "runs its own tools and conversation: task.tools and task.interaction are "
                                      "for horizonrl's agent loop, leave them out")
        if self.agents and (self.agent is None or len(set(self.agents)) != len(self.agents)):
            raise InvalidKey("agents", "names the distinct agents of a program through the gateway: set task.agent, "
                                       "and each name once")
        return self


class DistConfig(Section):
    """Training across processes (torchrun): how each rank holds actor, critic and reference (FSDP2).
    Read only when the run is launched by torchrun (WORLD_SIZE is set); a plain process ignores it."""

    backend: Literal["auto", "nccl", "gloo"] = Field("auto", description="auto: nccl on GPUs, gloo on the CPU")
    shard: bool = Field(True, description="true: FSDP2 shards parameters, gradients and optimizer state over "
                                          "the ranks; false: every rank holds them whole (gradients all-reduced)")
    mixed_precision: bool | Literal["auto"] = Field(
        "auto", description="bf16 parameters in forward/backward, fp32 gradient reduction and master weights; "
                            "auto: on where the ranks compute on CUDA (unless precision=fp32), off on a CPU")
    activation_checkpointing: bool = Field(False, description="recompute each decoder layer in backward")
    cpu_offload: bool = Field(False, description="sharded parameters, gradients and optimizer state in CPU memory")
    timeout_s: float = Field(600.0, gt=0, description="a collective that waits longer ends the job (a rank died)")


class BudgetConfig(Section):
    """Stop the run after the iteration that reaches either limit (runstate/budget.py); `iterations` still caps it."""

    env_steps: int | None = Field(None, gt=0, description="env steps (turns) of every rank, critic warmup included")
    wall_clock_s: float | None = Field(None, gt=0, description="seconds of iterations, over every resume")


class ValidationConfig(Section):
    """Greedy episodes on the validation seeds every `every` iterations and after the last; the best policy so
    far is kept as RUN/best/, the one `horizonrl eval RUN` evaluates (train/validation.py). One process, env
    episodes only."""

    every: int = Field(10, gt=0, description="iterations between validations (iteration 0 too: the initial policy)")
    episodes: int = Field(32, gt=0, description="greedy episodes per env id, on seeds apart from the training and "
                                                "the held-out seeds (rollout/seeds.py)")


class TrainConfig(Section):
    name: str = "toy"
    seed: int = Field(0, ge=0, description="env seeds count up from seed * 1_000_003 (rollout/seeds.py)")
    iterations: int = Field(60, ge=0)
    budget: BudgetConfig = BudgetConfig()
    save_every: int = Field(10, ge=0, description="iterations between resumable checkpoints (checkpoints/iter_N, "
                                                  "`train --resume`); 0: only after the last one and on a stop signal")
    device: str = "auto"
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="bf16 autocast over fp32 weights: auto = on CUDA and on CPUs with AMX-BF16 "
                            "(learner/device.py)")
    threads: Threads = Field(
        "auto", description="torch's CPU threads in each process of the run: auto = the usable cores but one, "
                            "divided among the run's processes that compute at once; torch's own count on a GPU "
                            "(learner/device.py); HORIZONRL_THREADS overrides")
    output_dir: str = "runs"
    model: ModelConfig = ModelConfig()
    env: EnvConfig = EnvConfig()
    agent: AgentConfig = AgentConfig()
    rollout: RolloutConfig = RolloutConfig()
    optim: OptimConfig = OptimConfig()
    actor: ActorConfig = ActorConfig()
    algorithm: Literal[ALGORITHMS] = "ppo"
    ppo: PPOConfig = PPOConfig()
    critic: CriticConfig = CriticConfig()
    samples: Literal["per_turn", "merged"] = Field(
        "per_turn", description="merged: one row per run of turns whose prompts extend each other; needs "
                                "agent.history=full for env episodes (agent-loop tasks always extend)")
    merge: MergeConfig = MergeConfig()
    group: GroupConfig = GroupConfig()
    gigpo: GiGPOConfig = GiGPOConfig()
    rae: RAEConfig = RAEConfig()
    selfplay: SelfPlayConfig = SelfPlayConfig()
    task: TaskConfig | None = None
    sft: SFTConfig = SFTConfig()
    report_to: list[Literal[SINKS]] = Field(["jsonl"], description="metrics sinks; jsonl is always written")
    dist: DistConfig = DistConfig()
    validation: ValidationConfig | None = Field(None, description="select the policy the run keeps on validation "
                                                                  "seeds; null: the last iteration's")

    def bf16_parameters(self, device_type: str) -> bool:
        """dist.mixed_precision resolved for ranks computing on `device_type`: auto is on on CUDA unless
        precision=fp32 (bf16 compute is what CUDA's `precision: auto` does anyway), off on a CPU (bf16 pays
        there only with AMX: learner/device.py)."""
        if self.dist.mixed_precision == "auto":
            return device_type == "cuda" and self.precision != "fp32"
        return self.dist.mixed_precision

    def sample_options(self, run_dir: Path) -> dict:
        """The keyword arguments of train.batch.prepare that choose per-turn or merged rows."""
        if self.samples == "per_turn":
            return {}
        return {"merge": self.merge, "mismatch_log": run_dir / runfolder.MERGE_MISMATCHES if self.merge.debug else None}

    @property
    def algorithm_spec(self) -> AlgorithmSpec:
        """What `algorithm` plays and needs (its row of algos/registry.py)."""
        return algorithm(self.algorithm)

    @model_validator(mode="after")
    def _task_fits(self) -> TrainConfig:
        plays_groups = self.algorithm_spec.batches is Batches.GROUPS
        if self.task is not None and not plays_groups:
            groups = ", ".join(name for name in ALGORITHMS if algorithm(name).batches is Batches.GROUPS)
            raise InvalidKey("algorithm", f"agent-loop tasks (task:) train with a group algorithm ({groups}), "
                                          f"not {self.algorithm}")
        if self.task is None and plays_groups and self.rollout.n_env < len(self.env.ids):
            raise InvalidKey("rollout.n_env", f"{self.rollout.n_env} env handles cannot play each of the "
                                              f"{len(self.env.ids)} env ids")
        if self.task is not None and self.validation is not None:
            raise InvalidKey("validation", "plays env episodes; an agent-loop task run (task:) has none to play")
        if self.task is not None and self.model.path is None and self.task.teacher is None:
            raise InvalidKey("task.teacher", "is needed to build a tiny model for a task (or set model.path)")
        return self

    @model_validator(mode="after")
    def _gigpo_has_state_keys(self) -> TrainConfig:
        """GiGPO groups turns by their env's state_key(): an env without one is refused before the run."""
        from horizonrl.envs import make
        from horizonrl.envs.base import has_state_key

        if self.algorithm_spec.step_credit and self.task is None:
            for env_id in self.env.ids:
                if not has_state_key(make(env_id, **self.env.kwargs)):
                    raise InvalidKey("algorithm", f"{self.algorithm} compares turns that start in the same env "
                                                  f"state, and env {env_id!r} has no state_key() "
                                                  "(horizonrl.envs.base.TextEnv)")
        return self

    @model_validator(mode="after")
    def _opponents_play_self_play_games(self) -> TrainConfig:
        """An opponent plays a seat of a game that asks the policy for every seat's move, in the learner's process,
        in whole-episode groups: one of them, and nowhere else."""
        from horizonrl.envs.two_player import SELF_PLAY

        selfplay = self.selfplay
        chosen = [key for key, value in (("selfplay.opponent_model", selfplay.opponent_model),
                                         ("selfplay.opponent_url", selfplay.opponent_url),
                                         ("selfplay.pool_size", selfplay.pool_size)) if value not in (None, 0)]
        if not chosen:
            return self
        key = chosen[0]
        if len(chosen) > 1:
            raise InvalidKey(key, f"{' and '.join(chosen)} each choose the opponent and exclude each other; set one")
        if self.task is not None or self.algorithm_spec.batches is not Batches.GROUPS:
            raise InvalidKey(key, "an opponent plays env episode groups (a group algorithm and an env, not a task)")
        if self.env.kwargs.get("opponent") != SELF_PLAY:
            raise InvalidKey(key, f"an opponent plays a seat of a game the policy would play every seat of; set "
                                  f"env.kwargs.opponent={SELF_PLAY} (got {self.env.kwargs.get('opponent')!r})")
        if self.rollout.async_training.in_a_process:
            raise InvalidKey(key, "the opponent's engine lives in the learner's process; a producer process has none "
                                  "(async_training.producer=thread)")
        return self

    @model_validator(mode="after")
    def _merged_rows_can_merge(self) -> TrainConfig:
        """With a window history no prompt extends the previous prompt + response: every turn would be
        a row of its own, as with per_turn, after a futile prefix comparison per turn."""
        if self.samples == "merged" and self.task is None and self.agent.history == "window":
            raise InvalidKey("samples", "merged rows need agent.history=full (with history=window no prompt "
                                        "extends the one before, so nothing merges); use samples=per_turn")
        return self

    @model_validator(mode="after")
    def _off_policy_is_corrected(self) -> TrainConfig:
        """With max_staleness K >= 1 the turns were sampled by up to K policies older than the one updated:
        TIS weighs each token by pi_proximal / pi_behaviour, capped (`tis_mode`), so the cap is required. The engine
        keeps sampling through the update, so vLLM may not sleep (free its weights) during it."""
        if self.rollout.async_training.max_staleness == 0:
            return self
        if self.actor.tis_cap is None:
            raise InvalidKey("actor.tis_cap", "rollout.async_training.max_staleness >= 1 trains on turns sampled "
                                              "by older weights; set actor.tis_cap to correct for them (1.0 when "
                                              "one update moves the policy far, 2.0 when it moves it little: "
                                              "BENCHMARKS.md, Asynchronous training)")
        if self.rollout.engine_spec.reserves_gpu_memory and self.rollout.vllm.enable_sleep_mode:
            raise InvalidKey("rollout.vllm.enable_sleep_mode", "asynchronous training keeps sampling while the "
                                                               "learner updates: vLLM cannot sleep then")
        return self

    @model_validator(mode="after")
    def _shared_prefixes_are_not_recomputed(self) -> TrainConfig:
        """A shared prefix's keys and values live in a cache that a checkpointed layer's recomputation in
        backward would append to a second time."""
        if self.optim.shared_prefix and self.dist.activation_checkpointing:
            raise InvalidKey("optim.shared_prefix", "is not supported with dist.activation_checkpointing=true "
                                                    "(the recomputed layers would extend the prefix's cache again)")
        return self

    @model_validator(mode="after")
    def _ppo_batch_divides(self) -> TrainConfig:
        """PPO's batch is n_env x e_len turns, cut into equal mini-batches (group batches are whatever
        rows the episodes make: any mini-batch size fits them)."""
        turns = self.rollout.n_env * self.ppo.e_len
        if self.algorithm_spec.batches is Batches.STREAMS and turns % self.optim.mini_batch_size:
            raise InvalidKey("optim.mini_batch_size", f"{self.optim.mini_batch_size} does not divide the "
                                                      f"rollout.n_env * ppo.e_len = {turns} turns of a PPO batch")
        return self


def default_recipe() -> Path:
    for folder in (SOURCE_CONFIGS, PACKAGE_CONFIGS):
        if (folder / DEFAULT_RECIPE).exists():
            return folder / DEFAULT_RECIPE
    raise ConfigError(f"default recipe {DEFAULT_RECIPE} not found in {SOURCE_CONFIGS} or {PACKAGE_CONFIGS}")


def load_config(path: str | Path | None = None, overrides: list[str] = (), run_folder: bool = False,
                runs_here: bool = True) -> TrainConfig:
    """Recipe YAML (default: configs/babyai_tiny.yaml) with `a.b.c=value` overrides (values parsed as YAML).

    `run_folder`: `path` is a run's own config.yaml, which a run written before the layout changed
    holds in the earlier layout: its MOVED keys are read at their place now (a recipe gets an error).
    `runs_here=False`: the config is only read on this machine (`horizonrl plan`), so the engine it
    names (vLLM) need not be installed here."""
    path = Path(path) if path is not None else default_recipe()
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys at the top level")
    if run_folder:
        for old, new in MOVED.items():
            if _has_dotted(raw, old):
                section, _, key = old.partition(".")
                _set_dotted(raw, new, raw[section].pop(key))
    return validate(apply_overrides(raw, overrides), runs_here)


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """`raw` (changed in place and returned) with each `a.b.c=value` override set (values parsed as YAML)."""
    for override in overrides:
        key, sep, value = override.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {override!r} is not of the form key=value")
        try:
            parsed = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError as error:
            reason = getattr(error, "problem", None) or error
            raise ConfigError(f"override {key.strip()}: {value!r} is not valid YAML ({reason})") from None
        _set_dotted(raw, key.strip(), parsed)
    return raw


def validate(raw: dict, runs_here: bool = True) -> TrainConfig:
    moved = [f"{old} moved to {new}" for old, new in MOVED.items() if _has_dotted(raw, old)]
    if moved:
        raise ConfigError("\n".join(moved))
    try:
        return TrainConfig.model_validate(raw, context={"runs_here": runs_here})
    except ValidationError as error:
        raise ConfigError("\n".join(_describe(e) for e in error.errors())) from None


def _has_dotted(raw: dict, key: str) -> bool:
    node = raw
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def setting_keys(model: type[BaseModel] | None = None, prefix: str = "") -> list[str]:
    """The dotted key of every setting (a field that is not a section) of the config."""
    keys = []
    for name, field in (model or TrainConfig).model_fields.items():
        sections = [kind for kind in typing.get_args(field.annotation) or (field.annotation,)
                    if isinstance(kind, type) and issubclass(kind, BaseModel)]
        keys += setting_keys(sections[0], f"{prefix}{name}.") if sections else [f"{prefix}{name}"]
    return keys


def closest_keys(key: str, n: int = 3) -> list[str]:
    """The settings most like `key`, by the whole dotted key or by its last part (a key given in the
    wrong section); a key like one that moved suggests its new place."""
    leaf = key.rpartition(".")[2]

    def likeness(known: str) -> float:
        return max(difflib.SequenceMatcher(None, key, known).ratio(),
                   difflib.SequenceMatcher(None, leaf, known.rpartition(".")[2]).ratio())

    candidates = [(known, known) for known in setting_keys()] + list(MOVED.items())
    scored = sorted(((likeness(name), place) for name, place in candidates), key=lambda pair: -pair[0])
    closest = list(dict.fromkeys(place for score, place in scored if score >= 0.75))
    return closest[:n]


def _describe(error: dict) -> str:
    """`key: what is wrong` for one pydantic error; the key is the field's dotted location, extended by
    the key an `InvalidKey` names."""
    loc = [str(part) for part in error["loc"]]
    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, InvalidKey):
        loc.append(cause.key)
    key = ".".join(loc) or "config"
    if error["type"] == "extra_forbidden":
        closest = closest_keys(key)
        return f"{key}: unknown key" + (f"; did you mean {' or '.join(closest)}?" if closest else "")
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "value_error" or not error["loc"]:
        return f"{key}: {message}"
    return f"{key}: {message} (got {error['input']!r})"


def _set_dotted(raw: dict, key: str, value: Any) -> None:
    node = raw
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key}: {part} is not a section")
        node = child
    node[parts[-1]] = value


def dump(config: TrainConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
