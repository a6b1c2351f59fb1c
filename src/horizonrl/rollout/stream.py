"""An env stream (one env handle and the episode running in it) and one agent turn on it.

Shared by the collectors: the fixed-turn collector keeps streams across iterations; the episode-group
collector runs one stream per rollout from a fixed seed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace

from horizonrl.agents.agent import Agent
from horizonrl.agents.prompt import HistoryEntry
from horizonrl.engines.base import Engine, SamplingParams
from horizonrl.engines.retry import generate_with_retry
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
    actions: list[str] = field(default_factory=list)   # executed in the running episode, in order
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
        self.history, self.actions = [], []
        self.episode_id = f"{self.task}/seed{self.seed}"
        self.episode_return, self.episode_length, self.invalid_actions = 0.0, 0, 0
        return errors

    def state_dict(self) -> dict:
        """The stream between turns, as JSON-able data (the env's state is its seed and the actions)."""
        return {"task": self.task, "next_seed": self.next_seed, "seed": self.seed, "episode_id": self.episode_id,
                "observation": self.observation, "actions": self.actions,
                "history": [[e.observation, e.plan, e.prompt_ids, e.response_ids] for e in self.history],
                "episode_return": self.episode_return, "episode_length": self.episode_length,
                "invalid_actions": self.invalid_actions}

    async def restore(self, state: dict) -> None:
        """Take `state` (from `state_dict`) and bring the env to the running episode's state: reset it to
        the episode's seed and replay the actions (envs are deterministic given both); the observation
        they lead to must be the saved one."""
        if state["task"] != self.task:
            raise ValueError(f"stream {self.index}: saved for task {state['task']!r}, not {self.task!r}")
        self.next_seed, self.seed, self.episode_id = state["next_seed"], state["seed"], state["episode_id"]
        self.observation, self.actions = state["observation"], list(state["actions"])
        self.history = [HistoryEntry(obs, plan, tuple(prompt), tuple(response))
                        for obs, plan, prompt, response in state["history"]]
        self.episode_return, self.episode_length = state["episode_return"], state["episode_length"]
        self.invalid_actions = state["invalid_actions"]
        if self.observation is None:
            return
        observation, _ = await self.env.reset(self.seed)
        for action in self.actions:
            observation, *_ = await self.env.step(action)
        if observation != self.observation:
            raise ValueError(f"stream {self.index}: replaying {self.episode_id}'s {len(self.actions)} actions does "
                             f"not lead to the saved observation (is {self.task} deterministic given its seed?):\n"
                             f"saved:    {self.observation!r}\nreplayed: {observation!r}")


async def play_turn(stream: EnvStream, agent: Agent, engine: Engine, params: SamplingParams) -> tuple[Turn, str]:
    """Prompt, sample, parse, step: one Turn and the observation after it. The Turn's info holds the
    env's info, the observation the agent acted on, and the engine's timing, finish reason and
    retried failures (`engine_retries`, when there were any)."""
    prompt_ids = agent.prompt_ids(stream.env, stream.history, stream.observation)
    state_key, seat = stream.env.state_key, stream.env.seat     # of the state the observation shows, before the step
    started = time.perf_counter()
    # the stream's episode seed, its index (rollouts of one seed differ in it) and the turn: one
    # random stream per request, whatever else the engine batches with it (a hash of ints is stable)
    request_seed = hash((stream.seed, stream.index, stream.episode_length))
    generation, retries = await generate_with_retry(engine, prompt_ids, replace(params, seed=request_seed))
    generate_s = time.perf_counter() - started
    decision, plan = agent.decide(stream.env, generation.token_ids)
    observation, reward, terminated, truncated, info = await stream.env.step(decision.action)
    if not decision.valid:
        reward += agent.invalid_penalty
        stream.invalid_actions += 1
    stream.history.append(HistoryEntry(stream.observation, plan, tuple(prompt_ids), tuple(generation.token_ids)))
    stream.actions.append(decision.action)
    stream.episode_return += reward
    stream.episode_length += 1
    info = dict(info, observation=stream.observation, generate_s=generate_s, finish_reason=generation.finish_reason,
                weights_version=generation.weights_version)
    if not decision.valid:
        info["invalid_output"] = decision.raw_action if decision.raw_action is not None else "<no ACTION:>"
    if retries:
        info["engine_retries"] = retries
    turn = Turn(prompt_ids, generation.token_ids, generation.logprobs, reward, terminated, truncated,
                decision.action, decision.valid, info, state_key, seat)
    return turn, observation


def finish_episode(episode: Episode, last: Turn, stream: EnvStream, agent: Agent, next_observation: str) -> None:
    """`last` ended `episode`: unless it terminated (a time limit), the prompt of s_{T+1} to bootstrap
    from; and the episode's metrics."""
    if not last.terminated:
        episode.bootstrap_prompt_ids = agent.prompt_ids(stream.env, stream.history, next_observation)
    episode.metrics = {
        "return": stream.episode_return, "length": stream.episode_length,
        "success": float(bool(last.info.get("success", last.terminated and last.reward > 0))),
        "invalid_actions": stream.invalid_actions,
    }


def close_on_error(episode: Episode, error: str, stream: EnvStream, agent: Agent) -> None:
    """End `episode` as truncated after its last completed turn, bootstrapped from the state the
    failed call started from; its metrics carry the error, so it is not counted as a failure."""
    last = episode.turns[-1]
    last.truncated = True
    last.info["error"] = error
    episode.bootstrap_prompt_ids = agent.prompt_ids(stream.env, stream.history, stream.observation)
    episode.metrics = {"error": error}


def note_errors(errors: list[str], sink: list[str]) -> None:
    """Keep env errors that were recovered from in `sink` (a collector's `errors`, summarised in one warning
    per batch: rollout/failures.py), each logged at DEBUG."""
    for error in errors:
        log.debug("env error, recovered: %s", error)
    sink.extend(errors)
