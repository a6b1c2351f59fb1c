"""Whole env episodes as group rollouts (GRPO and friends, GiGPO: `GroupCollector(EnvEpisodes(...), n_tasks,
group_size)`, rollout/groups.py).

A task is an env id and a seed; its `group_size` rollouts all start from that seed and share a
`group_id`, so a group estimator can compare them. With several env ids, task j of a batch plays
env_ids[j % len(env_ids)] (as stream j does in the fixed-turn collector). Each episode runs until the
env ends it or `max_turns` turns have been played (its last turn is then marked truncated;
`max_turns=None` leaves the limit to the env). Rollouts run concurrently, each on an env handle of its
env id taken from a free list, so the handles of an id bound how many of its rollouts are in flight.
An env error closes that episode as in the fixed-turn collector (its metrics carry the error;
estimators leave it out). `collect_seeds` plays given seeds of the first env id, e.g. held-out ones
(evaluate.py).

In a self-play game, a `SeatOpponent` (rollout/seat_opponents.py) may play a seat with its own engine: its turns
carry its name and are not trained.

The outcome reward of an episode is `reward_fn(episode)`, which sees the whole Episode — every turn,
its info and tool results (as ms-swift's reward functions see multi-turn infos); by default the
episode's return.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator

from horizonrl.agents.agent import Agent
from horizonrl.engines.base import Engine, SamplingParams
from horizonrl.envs.pool import EnvError
from horizonrl.records import Episode
from horizonrl.rollout.groups import GroupCollector
from horizonrl.rollout.seat_opponents import NO_OPPONENT, SeatOpponent
from horizonrl.rollout.seats import check_seat_history
from horizonrl.rollout.stream import EnvStream, close_on_error, finish_episode, note_errors, play_turn
from horizonrl.tools.registry import import_target

RewardFn = Callable[[Episode], float]


def episode_return(episode: Episode) -> float:
    return sum(turn.reward for turn in episode.turns)


def load_reward_fn(path: str | None) -> RewardFn:
    """"module:function" -> the function; None -> the episode return."""
    if path is None:
        return episode_return
    try:
        return import_target(path)
    except ValueError as error:
        raise ValueError(f"reward function {path!r} cannot be loaded: {error}") from None


def play_seeds(envs: list, env_id: str, agent: Agent, engine: Engine, params: SamplingParams, seeds: list[int],
               max_turns: int | None, opponent: SeatOpponent = NO_OPPONENT) -> list[Episode]:
    """One whole episode of `env_id` at each of `seeds` (held-out or validation seeds), on the handles `envs`;
    no training seed counter moves."""
    return GroupCollector(EnvEpisodes(envs, [env_id], agent, engine, params, max_turns, opponent=opponent),
                          n_tasks=len(seeds), group_size=1).collect_seeds(seeds)


class EnvEpisodes:
    """The player (rollout/groups.py) of whole env episodes: task j of a batch is (env_ids[j % len], seed)."""

    failures = "env errors in this batch (an episode one ended is left out of its group)"

    def __init__(self, envs: list, env_ids: list[str], agent: Agent, engine: Engine, params: SamplingParams,
                 max_turns: int | None, reward_fn: RewardFn = episode_return, opponent: SeatOpponent = NO_OPPONENT):
        """`envs`: async env handles (horizonrl.envs.pool), at least one per env id; rollouts share them.
        `opponent`: who plays a self-play game's other seat (rollout/seat_opponents.py)."""
        missing = set(env_ids) - {env.env_id for env in envs}
        if missing:
            raise ValueError(f"no env handle for {', '.join(sorted(missing))}")
        self.envs, self.env_ids, self.agent, self.engine, self.params = envs, env_ids, agent, engine, params
        self.max_turns, self.reward_fn, self.opponent = max_turns, reward_fn, opponent
        self._free: dict[str, asyncio.Queue] = {}

    def task(self, j: int, seed: int) -> tuple[str, int]:
        return self.env_ids[j % len(self.env_ids)], seed

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """The env handles of each id, free for the batch's rollouts to take."""
        self._free = {env_id: asyncio.Queue() for env_id in self.env_ids}
        for env in self.envs:
            if env.env_id in self._free:
                self._free[env.env_id].put_nowait(env)
        yield

    def counters(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        """Nothing to stop: the envs and the engine are the caller's."""

    async def play(self, task: tuple[str, int], k: int, errors: list[str]) -> Episode:
        env_id, seed = task
        free = self._free[env_id]
        env = await free.get()
        try:
            return await self._play(EnvStream(k, env, env_id, next_seed=seed, seed_stride=0), seed, errors)
        finally:
            free.put_nowait(env)

    async def _play(self, stream: EnvStream, seed: int, errors: list[str]) -> Episode:
        note_errors(await stream.reset(), errors)
        episode = Episode(f"{stream.episode_id}/rollout{stream.index}", stream.task, seed,
                          group_id=f"{stream.task}/seed{seed}")
        while True:
            opponent = self.opponent.plays(stream.env.seat, seed)
            try:
                turn, observation = await play_turn(stream, self.agent, self.opponent.engine if opponent
                                                    else self.engine, self.params)
            except EnvError as error:
                note_errors([str(error)], errors)
                if episode.turns:
                    close_on_error(episode, str(error), stream, self.agent)
                else:
                    episode.metrics = {"error": str(error)}
                return episode
            check_seat_history(episode, turn, self.agent)
            turn.policy = self.opponent.name if opponent else None
            episode.turns.append(turn)
            if len(episode.turns) == self.max_turns and not turn.terminated:
                turn.truncated = True
            if turn.terminated or turn.truncated:
                finish_episode(episode, turn, stream, self.agent, observation)
                episode.outcome_reward = float(self.reward_fn(episode))
                return episode
            stream.observation = observation
