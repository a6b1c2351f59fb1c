"""Task-group collector for the agent loop (GRPO and friends on tool-use and interaction tasks).

`make_task(seed)` gives a Task; each of `n_tasks` tasks is run `group_size` times through the agent
loop, concurrently, sharing a `group_id`. The outcome reward is `reward_fn(episode)`: the reward
function sees the whole Episode, every turn with its tool calls, tool results and interaction info,
and the task's own fields in `episode.data`. An episode counts as a success when its outcome reward
is positive.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from horizonrl.records import Episode, Task
from horizonrl.rollout.agent_loop import AgentLoop
from horizonrl.rollout.episode_groups import RewardFn
from horizonrl.rollout.seeds import first_training_seed


class TaskGroupCollector:
    def __init__(self, loop: AgentLoop, make_task: Callable[[int], Task], n_tasks: int, group_size: int,
                 reward_fn: RewardFn, seed: int = 0, share: range | None = None):
        """`share`: which of each batch's `n_tasks` tasks this process plays (a rank of a torchrun job;
        default all)."""
        self.loop, self.make_task, self.reward_fn = loop, make_task, reward_fn
        self.n_tasks, self.group_size = n_tasks, group_size
        self.share = range(n_tasks) if share is None else share
        self.next_seed = first_training_seed(seed)
        self.errors: list[str] = []      # the agent loop recovers from tool errors; nothing is lost here
        self.counts: dict[str, int] = {}

    def collect(self) -> list[Episode]:
        """`group_size` finished episodes of each of this process's share of the next `n_tasks` tasks,
        task by task, rollout by rollout."""
        tasks = [self.make_task(self.next_seed + j) for j in self.share]
        self.next_seed += self.n_tasks
        return asyncio.run(self._collect(tasks))

    def state_dict(self) -> dict:
        return {"next_seed": self.next_seed}

    def close(self) -> None:
        """Nothing to stop: the envs and the engine are the caller's."""

    def load_state_dict(self, state: dict) -> None:
        self.next_seed = state["next_seed"]

    async def _collect(self, tasks: list[Task]) -> list[Episode]:
        jobs = [self.loop.run(task, f"{task.task_id}/rollout{k}", group_id=task.task_id)
                for task in tasks for k in range(self.group_size)]
        episodes = list(await asyncio.gather(*jobs))
        for episode in episodes:
            episode.outcome_reward = float(self.reward_fn(episode))
            episode.metrics["success"] = float(episode.outcome_reward > 0)
        return episodes
