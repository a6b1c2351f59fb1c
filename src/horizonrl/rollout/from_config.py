"""The agent, engine and sampling parameters a run's config describes.

Training (train/loop.py) and evaluation (evaluate.py) both build them here, so a checkpoint is
evaluated with exactly the prompts, parsing, stop conditions and sampler it was trained with.
"""

from __future__ import annotations

import torch

from horizonrl.agents.agent import Agent
from horizonrl.config import AgentConfig, RolloutConfig
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.hf import HFEngine
from horizonrl.learner.device import autocast_dtype
from horizonrl.learner.models import pad_token_id, stop_ids


def make_agent(tokenizer, agent: AgentConfig) -> Agent:
    return Agent(tokenizer, agent.memory, agent.invalid_penalty, agent.translations, agent.history, agent.feedback)


def make_engine(model, tokenizer, rollout: RolloutConfig, seed: int, device: torch.device) -> HFEngine:
    """An in-process engine sampling from `model` itself (shared weights), seeded with `seed`."""
    return HFEngine(model, pad_token_id(tokenizer), rollout.max_batch_size, seed, autocast_dtype(device), tokenizer,
                    rollout.prefix_cache_tokens)


def sampling_params(rollout: RolloutConfig, tokenizer, model, agent: Agent,
                    temperature: float | None = None) -> SamplingParams:
    """The config's sampling parameters; `temperature` replaces its temperature (0: greedy)."""
    return SamplingParams(rollout.max_tokens, rollout.temperature if temperature is None else temperature,
                          rollout.top_p, stop_ids(tokenizer, model), agent.stop_patterns)
