"""Episode-group collector (GRPO and friends): `n_tasks` tasks x `group_size` whole episodes.

A task is an env id and a seed; its `group_size` rollouts all start from that seed and share a
`group_id`, so a group estimator can compare them. With several env ids, task j of a batch plays
env_ids[j % len(env_ids)] (as stream j does in the fixed-turn collector). Each episode runs until the
env ends it or `max_turns` turns have been played (its last turn is then marked truncated;
`max_turns=None` leaves the limit to the env). Rollouts run concurrently, each on an env handle of its
env id taken from a free list, so the handles of an id bound how many of its rollouts are in flight.
An env error closes that episode as in the fixed-turn collector (its metrics carry the error;
estimators leave it out). `collect_seeds` plays given seeds, e.g. held-out ones (evaluate.py).

The outcome reward of an episode is `reward_fn(episode)`, which sees the whole Episode — every turn,
its info and tool results (as ms-swift's reward functions see multi-turn infos); by default the
episode's return.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from horizonrl.agents.agent import Agent
from horizonrl.engines.base import Engine, SamplingParams
from horizonrl.envs.pool import EnvError
from horizonrl.records import Episode
from horizonrl.rollout.failures import log_failures
from horizonrl.rollout.seeds import first_training_seed
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


class EpisodeGroupCollector:
    def __init__(self, envs: list, env_ids: list[str], agent: Agent, engine: Engine, params: SamplingParams,
                 n_tasks: int, group_size: int, max_turns: int | None, reward_fn: RewardFn = episode_return,
                 seed: int = 0, share: range | None = None):
        """`envs`: async env handles (horizonrl.envs.pool), at least one per env id; rollouts share them.
        `share`: which of each batch's `n_tasks` tasks this process plays (a rank of a torchrun job;
        default all)."""
        missing = set(env_ids) - {env.env_id for env in envs}
        if missing:
            raise ValueError(f"no env handle for {', '.join(sorted(missing))}")
        self.envs, self.env_ids, self.agent, self.engine, self.params = envs, env_ids, agent, engine, params
        self.n_tasks, self.group_size, self.max_turns, self.reward_fn = n_tasks, group_size, max_turns, reward_fn
        self.share = range(n_tasks) if share is None else share
        self.next_seed = first_training_seed(seed)
        self.errors: list[str] = []
        self.counts: dict[str, int] = {}

    def collect(self) -> list[Episode]:
        """`group_size` finished episodes of each of this process's share of the next `n_tasks` training
        seeds, grouped: task by task, rollout by rollout."""
        tasks = [(self.env_ids[j % len(self.env_ids)], self.next_seed + j) for j in self.share]
        self.next_seed += self.n_tasks
        return self._play_all(tasks)

    def state_dict(self) -> dict:
        return {"next_seed": self.next_seed}

    def close(self) -> None:
        """Nothing to stop: the envs and the engine are the caller's."""

    def load_state_dict(self, state: dict) -> None:
        self.next_seed = state["next_seed"]

    def collect_seeds(self, seeds: list[int]) -> list[Episode]:
        """`group_size` finished episodes of the first env id from each of `seeds` (e.g. held-out seeds
        for evaluation), seed by seed; the training seed counter does not move."""
        return self._play_all([(self.env_ids[0], seed) for seed in seeds])

    def _play_all(self, tasks: list[tuple[str, int]]) -> list[Episode]:
        """`group_size` rollouts of each (env id, seed) of `tasks`; their env errors in `errors`, logged in one
        warning."""
        self.errors = []
        episodes = asyncio.run(self._collect(tasks))
        log_failures(self.errors, "env errors in this batch (an episode one ended is left out of its group)")
        return episodes

    async def _collect(self, tasks: list[tuple[str, int]]) -> list[Episode]:
        free: dict[str, asyncio.Queue] = {env_id: asyncio.Queue() for env_id in self.env_ids}
        for env in self.envs:
            if env.env_id in free:
                free[env.env_id].put_nowait(env)
        jobs = [self._rollout(free[env_id], env_id, seed, k) for env_id, seed in tasks for k in range(self.group_size)]
        return list(await asyncio.gather(*jobs))

    async def _rollout(self, free: asyncio.Queue, env_id: str, seed: int, k: int) -> Episode:
        env = await free.get()
        try:
            return await self._play(EnvStream(k, env, env_id, next_seed=seed, seed_stride=0), seed)
        finally:
            free.put_nowait(env)

    async def _play(self, stream: EnvStream, seed: int) -> Episode:
        note_errors(await stream.reset(), self.errors)
        episode = Episode(f"{stream.episode_id}/rollout{stream.index}", stream.task, seed,
                          group_id=f"{stream.task}/seed{seed}")
        while True:
            try:
                turn, observation = await play_turn(stream, self.agent, self.engine, self.params)
            except EnvError as error:
                note_errors([str(error)], self.errors)
                if episode.turns:
                    close_on_error(episode, str(error), stream, self.agent)
                else:
                    episode.metrics = {"error": str(error)}
                return episode
            episode.turns.append(turn)
            if len(episode.turns) == self.max_turns and not turn.terminated:
                turn.truncated = True
            if turn.terminated or turn.truncated:
                finish_episode(episode, turn, stream, self.agent, observation)
                episode.outcome_reward = float(self.reward_fn(episode))
                return episode
            stream.observation = observation
