"""Agent-loop tasks as group rollouts (GRPO and friends on tool-use and interaction tasks:
`GroupCollector(AgentLoopTasks(...), n_tasks, group_size)`, rollout/groups.py).

`make_task(seed)` gives a Task; each of `n_tasks` tasks is run `group_size` times through the agent
loop, concurrently, sharing a `group_id`. The outcome reward is `reward_fn(episode)`: the reward
function sees the whole Episode, every turn with its tool calls, tool results and interaction info,
and the task's own fields in `episode.data`. An episode counts as a success when its outcome reward
is positive. The agent loop recovers from tool errors: no rollout fails here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from horizonrl.records import Episode, Task
from horizonrl.rollout.agent_loop import AgentLoop
from horizonrl.rollout.episode_groups import RewardFn


class AgentLoopTasks:
    """The player (rollout/groups.py) of tasks through the agent loop: task j of a batch is `make_task(seed)`."""

    failures = "rollouts failed"

    def __init__(self, loop: AgentLoop, make_task: Callable[[int], Task], reward_fn: RewardFn):
        self.loop, self.make_task, self.reward_fn = loop, make_task, reward_fn

    def task(self, j: int, seed: int) -> Task:
        return self.make_task(seed)

    def batch(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def counters(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        """Nothing to stop: the envs and the engine are the caller's."""

    async def play(self, task: Task, k: int, errors: list[str]) -> Episode:
        episode = await self.loop.run(task, f"{task.task_id}/rollout{k}", group_id=task.task_id)
        episode.outcome_reward = float(self.reward_fn(episode))
        episode.metrics["success"] = float(episode.outcome_reward > 0)
        return episode
