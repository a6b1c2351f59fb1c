"""A tiny policy that follows the response format, built offline from an env.

1. Train a byte-level BPE tokenizer on the env's own text (instruction, observations, the agent's
   prompt scaffolding and format-correct responses).
2. Build a randomly initialised Llama-architecture model for it.
3. Fine-tune it on demonstrations whose format is right and whose actions are uniformly random,
   collected through the real agent and collector (so prompts are exactly those RL will use).
The result follows the format but knows nothing about which action is good: RL must do the rest.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from horizonrl.agents.agent import Agent
from horizonrl.agents.prompt import RESPONSE_FORMAT, plan_text, restate, system_prompt
from horizonrl.config import TinyModel, WarmStart
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.scripted import RandomFormatEngine
from horizonrl.envs.base import TextEnv
from horizonrl.learner.models import build_tiny_policy
from horizonrl.learner.sft import supervised_finetune
from horizonrl.learner.tokenizer import train_bpe_tokenizer
from horizonrl.rollout.failures import raise_if_none_succeeded
from horizonrl.rollout.fixed_turn import FixedTurnCollector
from horizonrl.samples.per_turn import per_turn

log = logging.getLogger(__name__)


def env_corpus(env: TextEnv, episodes: int = 64, max_steps: int = 2000, seed: int = 0) -> list[str]:
    """Text the agent will read and write in `env`: instructions, observations under random play
    (at most `episodes` episodes and `max_steps` steps in all), prompt scaffolding and format-correct
    responses."""
    rng = random.Random(seed)
    texts = [system_prompt(env.instruction), RESPONSE_FORMAT, "system user assistant",
             "Observation:\nPrevious plan:\nCurrent Observation:\n"]
    steps = 0
    for episode in range(episodes):
        observation, _ = env.reset(seed * 100_003 + episode)
        if system_prompt(env.instruction) not in texts:     # missions that change with the episode
            texts.append(system_prompt(env.instruction))
        done = False
        while not done and steps < max_steps:
            action = rng.choice(env.actions)
            texts += [observation, plan_text(restate(observation), action)]
            observation, _, terminated, truncated, _ = env.step(action)
            done, steps = terminated or truncated, steps + 1
        texts.append(observation)
        if steps >= max_steps:
            break
    return texts


def build_tiny_for_envs(envs: list[TextEnv], tiny: TinyModel, seed: int, device):
    """(tokenizer, model): a BPE tokenizer trained on the text of every env in `envs` (the symbols of their
    maps, `env.map_symbols`, kept a token each) and a random tiny model for it."""
    symbols = "".join(sorted({symbol for env in envs for symbol in getattr(env, "map_symbols", "")}))
    return build_tiny([text for env in envs for text in env_corpus(env, seed=seed)], tiny, seed, device,
                      isolated=symbols)


def build_tiny(corpus: list[str], tiny: TinyModel, seed: int, device, individual_digits: bool = False,
               isolated: str = ""):
    """(tokenizer, model): a BPE tokenizer trained on `corpus` (see train_bpe_tokenizer) and a random tiny
    model for it."""
    tokenizer = train_bpe_tokenizer(corpus, tiny.vocab_size, individual_digits, isolated)
    model = build_tiny_policy(tokenizer, tiny.hidden_size, tiny.num_layers, tiny.num_heads, tiny.num_kv_heads,
                              tiny.intermediate_size, tiny.max_position_embeddings, seed)
    return tokenizer, model.to(device)


def format_warm_start(model, agent: Agent, envs: list, warm_start: WarmStart, seed: int,
                      check: Callable[[], None]) -> list[float]:
    """Fine-tune `model` in place to answer in the THINK/ACTION format with uniformly random actions,
    on exactly the prompts `agent` builds; returns the loss of every step. `check()` before every batch of
    demonstrations and every step (it raises to stop). A first batch in which every env step failed raises
    RolloutsFailed."""
    tokenizer = agent.tokenizer
    demonstrator = RandomFormatEngine(tokenizer, envs[0].actions, seed=seed)
    collector = FixedTurnCollector(envs, agent, demonstrator, SamplingParams(stop_patterns=agent.stop_patterns),
                                   warm_start.turns, seed=seed + 7919)
    demos = []
    for _ in range(warm_start.iterations):
        check()
        demos += collector.collect()
        raise_if_none_succeeded(sum(len(e.turns) for e in demos), len(envs) * warm_start.turns, collector.errors,
                                "env step of the warm start's first batch", "there is nothing to learn from; "
                                "nothing was saved")
    log.info("warm start: %d steps on %d demonstration turns", warm_start.steps, sum(len(e.turns) for e in demos))
    losses = supervised_finetune(model, per_turn(demos), tokenizer.pad_token_id, warm_start.steps,
                                 warm_start.batch_size, warm_start.lr, seed=seed, check=check)
    if losses:
        log.info("warm start: loss %.3f -> %.3f", losses[0], losses[-1])
    return losses
