"""Fixed-turn collector (Verlog): n_env persistent env streams x e_len turns per iteration.

One asyncio task per stream; the engine batches whatever requests are pending. A stream is reset
only when its episode ends, so an episode can span iterations; each iteration returns the fragment
of every episode that had turns in it. A fragment still running after the e_len turns, or truncated
by the env's time limit, carries the prompt of its next state (no action sampled) so the learner can
bootstrap from its value.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from horizonrl.agents.agent import Agent
from horizonrl.agents.prompt import HistoryEntry
from horizonrl.engines.base import Engine, SamplingParams
from horizonrl.envs.base import TextEnv
from horizonrl.records import Episode, Turn


@dataclass
class EnvStream:
    """One env and the episode running in it."""

    index: int
    env: TextEnv
    task: str
    next_seed: int
    seed_stride: int
    history: list[HistoryEntry] = field(default_factory=list)
    observation: str | None = None       # None: the stream must reset before its next turn
    episode_id: str = ""
    seed: int = -1
    episode_return: float = 0.0
    episode_length: int = 0
    invalid_actions: int = 0

    def reset(self) -> None:
        self.seed = self.next_seed
        self.next_seed += self.seed_stride
        self.observation, _ = self.env.reset(self.seed)
        self.history = []
        self.episode_id = f"{self.task}/seed{self.seed}"
        self.episode_return, self.episode_length, self.invalid_actions = 0.0, 0, 0


class FixedTurnCollector:
    def __init__(self, envs: list[TextEnv], task: str, agent: Agent, engine: Engine, params: SamplingParams,
                 e_len: int, seed: int = 0):
        self.agent, self.engine, self.params, self.e_len = agent, engine, params, e_len
        self.streams = [EnvStream(i, env, task, next_seed=seed * 1_000_003 + i, seed_stride=len(envs))
                        for i, env in enumerate(envs)]

    def collect(self) -> list[Episode]:
        """Run every stream for e_len turns; the episode fragments, stream by stream, in time order."""
        return asyncio.run(self.collect_async())

    async def collect_async(self) -> list[Episode]:
        fragments = await asyncio.gather(*(self._run_stream(s) for s in self.streams))
        return [episode for stream_fragments in fragments for episode in stream_fragments]

    async def _run_stream(self, stream: EnvStream) -> list[Episode]:
        fragments: list[Episode] = []
        episode: Episode | None = None
        for _ in range(self.e_len):
            if stream.observation is None:
                stream.reset()
            if episode is None:
                episode = Episode(stream.episode_id, stream.task, stream.seed)
            turn, next_observation = await self._turn(stream)
            episode.turns.append(turn)
            if turn.terminated or turn.truncated:
                if not turn.terminated:
                    episode.bootstrap_prompt_ids = self.agent.prompt_ids(stream.env, stream.history,
                                                                         next_observation)
                episode.metrics = {
                    "return": stream.episode_return, "length": stream.episode_length,
                    "success": float(bool(turn.info.get("success", turn.terminated and turn.reward > 0))),
                    "invalid_actions": stream.invalid_actions,
                }
                fragments.append(episode)
                episode, stream.observation = None, None
            else:
                stream.observation = next_observation
        if episode is not None:
            episode.bootstrap_prompt_ids = self.agent.prompt_ids(stream.env, stream.history, stream.observation)
            fragments.append(episode)
        return fragments

    async def _turn(self, stream: EnvStream) -> tuple[Turn, str]:
        """Prompt, sample, parse, step: one Turn and the observation after it."""
        prompt_ids = self.agent.prompt_ids(stream.env, stream.history, stream.observation)
        started = time.perf_counter()
        generation = await self.engine.generate(prompt_ids, self.params)
        generate_s = time.perf_counter() - started
        decision, plan = self.agent.decide(stream.env, generation.token_ids)
        observation, reward, terminated, truncated, info = stream.env.step(decision.action)
        if not decision.valid:
            reward += self.agent.invalid_penalty
            stream.invalid_actions += 1
        stream.history.append(HistoryEntry(stream.observation, plan))
        stream.episode_return += reward
        stream.episode_length += 1
        info = dict(info, generate_s=generate_s, finish_reason=generation.finish_reason)
        if not decision.valid:
            info["invalid_output"] = decision.raw_action
        turn = Turn(prompt_ids, generation.token_ids, generation.logprobs, reward, terminated, truncated,
                    decision.action, decision.valid, info)
        return turn, observation
