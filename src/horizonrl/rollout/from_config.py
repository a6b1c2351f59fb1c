"""The agent, engine and sampling parameters a run's config describes.

Training (train/loop.py) and evaluation (evaluate.py) both build them here, so a checkpoint is
evaluated with exactly the prompts, parsing, stop conditions and sampler it was trained with.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from horizonrl.agents.agent import Agent
from horizonrl.config import AgentConfig, RolloutConfig, TrainConfig
from horizonrl.engines.base import SamplingParams, TrainingEngine
from horizonrl.engines.hf import HFEngine
from horizonrl.errors import ConfigError
from horizonrl.learner.device import autocast_dtype
from horizonrl.learner.lora import merged_parameters
from horizonrl.learner.models import engine_copy, load_policy, pad_token_id, stop_ids
from horizonrl.rollout.seat_opponents import NO_OPPONENT, SERVER, OpponentPool, SeatOpponent


def make_agent(tokenizer, agent: AgentConfig) -> Agent:
    return Agent(tokenizer, agent.memory, agent.invalid_penalty, agent.translations, agent.history, agent.feedback)


def make_engine(model, tokenizer, rollout: RolloutConfig, seed: int, device: torch.device,
                weights_dir: Path | None = None, tensors=None) -> TrainingEngine:
    """The engine `rollout.engine` names, sampling from `model`'s weights, seeded with `seed`, on `device`
    (this rank's GPU under torchrun); each builder below says what it does with `weights_dir`.
    `tensors`: the (name, whole tensor) pairs vllm and openai start from when `model`'s own state dict
    is not them (a sharded or LoRA-wrapped model: learner/lora.merged_parameters)."""
    return ENGINE_BUILDERS[rollout.engine](model, tokenizer, rollout, seed, device, weights_dir, tensors)


def vllm_engine(model, tokenizer, rollout: RolloutConfig, seed: int, device: torch.device,
                weights_dir: Path | None, tensors) -> TrainingEngine:
    """vllm loads a copy of the weights from the folder `weights_dir`/rank<R> (R: torchrun's $RANK, 0 without
    it; rollout.vllm.weights_dir, if set, replaces `weights_dir`; None and unset: a temporary folder)."""
    from horizonrl.engines.vllm_engine import VLLMEngine

    options = rollout.vllm
    dtype = (autocast_dtype(device) or torch.float32) if options.dtype == "auto" else getattr(torch, options.dtype)
    memory = options.gpu_memory_utilization or (0.5 if device.type == "cuda" else 0.2)
    if options.weights_dir is not None:
        weights_dir = Path(options.weights_dir)
    folder = None if weights_dir is None else weights_dir / f"rank{os.environ.get('RANK', '0')}"
    return VLLMEngine(model, tokenizer, seed, dtype, memory, options.tensor_parallel_size,
                      options.enable_prefix_caching, options.max_num_seqs or rollout.max_batch_size,
                      options.max_model_len, options.enable_sleep_mode, device, tensors, folder, options.enforce_eager)


def openai_engine(model, tokenizer, rollout: RolloutConfig, seed: int, device: torch.device,
                  weights_dir: Path | None, tensors) -> TrainingEngine:
    """openai talks to the server at rollout.openai.base_url, which is sent new weights through `weights_dir`
    (rollout.openai.weights_dir, if set, replaces it; None and unset: the engine serves eval only)."""
    from horizonrl.engines.openai_server import OpenAIServerEngine

    options = rollout.openai
    if weights_dir is not None and options.weights_dir is not None:
        weights_dir = Path(options.weights_dir)
    engine = OpenAIServerEngine(tokenizer, options.base_url, options.api_key, options.model, options.timeout_s,
                                seed, weights_dir, updates_in_flight=rollout.async_training.max_staleness > 0)
    if weights_dir is not None:   # training: the server samples from the learner's weights from the start
        engine.sync_weights(model, tensors)
    return engine


def hf_engine(model, tokenizer, rollout: RolloutConfig, seed: int, device: torch.device,
              weights_dir: Path | None, tensors) -> TrainingEngine:
    """hf samples from `model` itself (its weights are the learner's, or a copy the caller keeps)."""
    return HFEngine(model, pad_token_id(tokenizer), rollout.max_batch_size, seed, autocast_dtype(device), tokenizer,
                    rollout.prefix_cache_tokens, decode_step=rollout.decode_step)


ENGINE_BUILDERS = {"hf": hf_engine, "vllm": vllm_engine, "openai": openai_engine}  # engines/registry.py's names


def make_seat_opponent(cfg: TrainConfig, tokenizer, actor, device: torch.device) -> SeatOpponent:
    """Who plays the seat of a self-play game the trained policy does not (`selfplay`, rollout/seat_opponents.py): a
    model folder's policy or a pool of `actor`'s snapshots, each sampled by an hf engine of its own in this process,
    or a served model; else no one (the policy plays every seat)."""
    selfplay = cfg.selfplay
    if selfplay.opponent_model is not None:
        return model_opponent(selfplay.opponent_model, tokenizer, cfg.rollout, cfg.seed, device)
    if selfplay.opponent_url is not None:
        return served_opponent(selfplay.opponent_url, tokenizer, cfg.rollout, cfg.seed)
    if not selfplay.pool_size:
        return NO_OPPONENT
    copy = engine_copy(actor, autocast_dtype(device) or torch.float32, device)

    def snapshot() -> dict[str, torch.Tensor]:
        return {name: tensor.detach().to("cpu", copy=True) for name, tensor in merged_parameters(actor)}
    return OpponentPool(hf_engine(copy, tokenizer, cfg.rollout, cfg.seed + 1, device, None, None), snapshot,
                        selfplay.pool_size, selfplay.snapshot_every, cfg.seed)


def model_opponent(path: str, tokenizer, rollout: RolloutConfig, seed: int, device: torch.device,
                   learner_seat: int | None = None) -> SeatOpponent:
    """The policy in the model folder `path` as a seat opponent ("model:<path>"), on an hf engine of its own. It
    reads the trained policy's prompts and its ids are parsed with the policy's tokenizer: another tokenizer, or
    no folder at `path`, is a ConfigError."""
    if not Path(path).expanduser().is_dir():
        raise ConfigError(f"the opponent model {path} is no folder (a model folder with the policy's tokenizer)")
    theirs, model = load_policy(path, device)
    if theirs.get_vocab() != tokenizer.get_vocab():
        raise ConfigError(f"the opponent model {path} has another tokenizer than the policy's (an opponent reads "
                          "the policy's prompts, and its ids are parsed with the policy's tokenizer)")
    return SeatOpponent(f"model:{path}", hf_engine(model, tokenizer, rollout, seed + 1, device, None, None),
                        learner_seat)


def served_opponent(url: str, tokenizer, rollout: RolloutConfig, seed: int,
                    learner_seat: int | None = None) -> SeatOpponent:
    """The model served at `url` (the /v1 URL of an OpenAI-compatible server that returns token ids: vLLM,
    `horizonrl gateway`) as a seat opponent ("server:<url>"), sampled through engines/openai_server.py, which sends
    the policy's prompt ids and parses the ids sampled with the policy's tokenizer: the server must serve a model
    with that tokenizer. No weights are ever sent to it. A server that does not answer, or returns no token ids, is
    an EngineError naming the URL."""
    from horizonrl.engines.openai_server import OpenAIServerEngine

    engine = OpenAIServerEngine(tokenizer, url, rollout.openai.api_key, None, rollout.openai.timeout_s, seed + 1)
    return SeatOpponent(f"{SERVER}{url}", engine, learner_seat)


def sampling_params(rollout: RolloutConfig, tokenizer, model, agent: Agent,
                    temperature: float | None = None) -> SamplingParams:
    """The config's sampling parameters; `temperature` replaces its temperature (0: greedy)."""
    return SamplingParams(rollout.max_tokens, rollout.temperature if temperature is None else temperature,
                          rollout.top_p, stop_ids(tokenizer, model), agent.stop_patterns)
