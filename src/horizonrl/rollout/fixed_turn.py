"""Fixed-turn collector (Verlog): n_env persistent env streams x e_len turns per iteration.

One asyncio task per stream; the engine batches whatever requests are pending. A stream is reset
only when its episode ends, so an episode can span iterations; each iteration returns the fragment
of every episode that had turns in it. A fragment still running after the e_len turns, or truncated
by the env's time limit, carries the prompt of its next state (no action sampled) so the learner can
bootstrap from its value.

An env call that fails (`EnvError`: it raised or hung, and its handle has rebuilt the env) closes
the running episode as truncated at its last completed turn, with the error in that turn's `info`;
the failed turn's sample is dropped, the error is logged and kept in `collector.errors`, and the
stream starts a new episode. A reset that fails MAX_RESET_ATTEMPTS times in a row stops the run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from horizonrl.agents.agent import Agent
from horizonrl.agents.prompt import HistoryEntry
from horizonrl.engines.base import Engine, SamplingParams
from horizonrl.envs.pool import EnvError
from horizonrl.records import Episode, Turn

log = logging.getLogger(__name__)
MAX_RESET_ATTEMPTS = 3


@dataclass
class EnvStream:
    """One env and the episode running in it."""

    index: int
    env: object                          # an async env handle from horizonrl.envs.pool
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

    async def reset(self) -> list[str]:
        """Start the next episode (a failing seed is skipped); returns the errors met on the way."""
        errors = []
        while True:
            self.seed = self.next_seed
            self.next_seed += self.seed_stride
            try:
                self.observation, _ = await self.env.reset(self.seed)
                break
            except EnvError as error:
                errors.append(str(error))
                if len(errors) == MAX_RESET_ATTEMPTS:
                    raise RuntimeError(f"{self.task}: reset failed {len(errors)} times in a row:\n"
                                       + "\n".join(errors)) from None
        self.history = []
        self.episode_id = f"{self.task}/seed{self.seed}"
        self.episode_return, self.episode_length, self.invalid_actions = 0.0, 0, 0
        return errors


class FixedTurnCollector:
    def __init__(self, envs: list, task: str, agent: Agent, engine: Engine, params: SamplingParams,
                 e_len: int, seed: int = 0):
        """`envs`: async env handles (horizonrl.envs.pool), one per stream."""
        self.agent, self.engine, self.params, self.e_len = agent, engine, params, e_len
        self.streams = [EnvStream(i, env, task, next_seed=seed * 1_000_003 + i, seed_stride=len(envs))
                        for i, env in enumerate(envs)]
        self.errors: list[str] = []

    def collect(self) -> list[Episode]:
        """Run every stream for e_len turns; the episode fragments, stream by stream, in time order.
        `self.errors` holds the env errors recovered from during this call."""
        self.errors = []
        return asyncio.run(self.collect_async())

    async def collect_async(self) -> list[Episode]:
        fragments = await asyncio.gather(*(self._run_stream(s) for s in self.streams))
        return [episode for stream_fragments in fragments for episode in stream_fragments]

    async def _run_stream(self, stream: EnvStream) -> list[Episode]:
        fragments: list[Episode] = []
        episode: Episode | None = None
        for _ in range(self.e_len):
            if stream.observation is None:
                self._recovered(await stream.reset())
            if episode is None:
                episode = Episode(stream.episode_id, stream.task, stream.seed)
            try:
                turn, next_observation = await self._turn(stream)
            except EnvError as error:
                self._recovered([str(error)])
                if episode.turns:
                    close_on_error(episode, str(error), self.agent.prompt_ids(stream.env, stream.history,
                                                                              stream.observation))
                    fragments.append(episode)
                episode, stream.observation = None, None
                continue
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

    def _recovered(self, errors: list[str]) -> None:
        for error in errors:
            log.warning("env error, recovered: %s", error)
        self.errors.extend(errors)

    async def _turn(self, stream: EnvStream) -> tuple[Turn, str]:
        """Prompt, sample, parse, step: one Turn and the observation after it."""
        prompt_ids = self.agent.prompt_ids(stream.env, stream.history, stream.observation)
        started = time.perf_counter()
        generation = await self.engine.generate(prompt_ids, self.params)
        generate_s = time.perf_counter() - started
        decision, plan = self.agent.decide(stream.env, generation.token_ids)
        observation, reward, terminated, truncated, info = await stream.env.step(decision.action)
        if not decision.valid:
            reward += self.agent.invalid_penalty
            stream.invalid_actions += 1
        stream.history.append(HistoryEntry(stream.observation, plan))
        stream.episode_return += reward
        stream.episode_length += 1
        info = dict(info, generate_s=generate_s, finish_reason=generation.finish_reason)
        if not decision.valid:
            info["invalid_output"] = decision.raw_action if decision.raw_action is not None else "<no ACTION:>"
        turn = Turn(prompt_ids, generation.token_ids, generation.logprobs, reward, terminated, truncated,
                    decision.action, decision.valid, info)
        return turn, observation


def close_on_error(episode: Episode, error: str, bootstrap_prompt_ids: list[int]) -> None:
    """End `episode` as truncated after its last completed turn (bootstrapped from the state the
    failed call started from); its metrics carry the error, so it is not counted as a failure."""
    last = episode.turns[-1]
    last.truncated = True
    last.info["error"] = error
    episode.bootstrap_prompt_ids = bootstrap_prompt_ids
    episode.metrics = {"error": error}
