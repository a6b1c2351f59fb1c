"""Group collectors (GRPO and friends, GiGPO): `n_tasks` tasks a batch, each played `group_size` times at once.

Every group collector has this one shape, `GroupCollector`; what differs is how one rollout is played, its
`Player`:

    EnvEpisodes     (rollout/episode_groups.py)   whole episodes of an env, from a seed
    AgentLoopTasks  (rollout/task_groups.py)      tasks through the agent loop (tools, interactions)
    GatewayAgents   (gateway/agent_groups.py)   the user's own OpenAI-API agents, through the gateway

The collector owns what they share: the training seed counter (`first_training_seed(seed)`, advanced by
`n_tasks` a batch, checkpointed), this process's share of each batch's tasks (a torchrun rank's: task j of
the batch is the player's `task(j, seed)` at seed first + j), the failures (`errors`, one cause each,
summarised in one warning per batch) and the counters (`counts`) of the last batch. Its episodes come task by
task, rollout by rollout; a rollout that failed carries metrics["error"], and the group estimators leave it
out of its group. In asynchronous training (`produce`) the next batch's rollouts start while the slowest of
the batch before still run.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from horizonrl.records import Episode
from horizonrl.rollout.collector import Deliver
from horizonrl.rollout.failures import log_failures
from horizonrl.rollout.seats import by_seat
from horizonrl.rollout.seeds import first_training_seed


class Player(Protocol):
    """How one rollout of a task is played."""

    failures: str
    """What a batch's failures are, for its warning: "<count> <failures>: <causes>" ("{rollouts}": how many the
    batch played)."""

    def task(self, j: int, seed: int) -> Any:
        """Task j of a batch, at env seed `seed`."""
        ...

    async def play(self, task: Any, k: int, errors: list[str]) -> Episode:
        """Rollout k of `task`; the cause of each failure (dropped: metrics["error"], or recovered) to `errors`."""
        ...

    def batch(self) -> contextlib.AbstractContextManager:
        """Around the rollouts of one batch, or of overlapping batches (`GroupCollector.produce`)."""
        ...

    def counters(self) -> dict[str, int]:
        """What the player has counted so far (the gateway's `gateway/<name>`); a batch's counts are the change."""
        ...

    def close(self) -> None:
        """Stop what the player started; it is not used again."""
        ...


class GroupCollector:
    def __init__(self, player: Player, n_tasks: int, group_size: int, seed: int = 0, share: range | None = None):
        """`share`: which of each batch's `n_tasks` tasks this process plays (a rank of a torchrun job; default
        all)."""
        self.player, self.n_tasks, self.group_size = player, n_tasks, group_size
        self.share = range(n_tasks) if share is None else share
        self.next_seed = first_training_seed(seed)
        self.errors: list[str] = []
        self.counts: dict[str, int] = {}

    def collect(self) -> list[Episode]:
        """`group_size` episodes of each of this process's share of the next `n_tasks` tasks."""
        tasks = [self.player.task(j, self.next_seed + j) for j in self.share]
        self.next_seed += self.n_tasks
        return self.run(tasks)

    def collect_seeds(self, seeds: list[int]) -> list[Episode]:
        """`group_size` episodes of task 0's kind at each of `seeds` (e.g. held-out seeds for evaluation), seed by
        seed; the training seed counter does not move."""
        return self.run([self.player.task(0, seed) for seed in seeds])

    def run(self, tasks: list) -> list[Episode]:
        """`group_size` rollouts of each of `tasks`, all at once: task by task, rollout by rollout."""
        self.errors, before = [], self.player.counters()
        with self.player.batch():
            episodes = asyncio.run(self._play(tasks, self.errors))
        self.counts = counted_since(before, self.player.counters())
        log_failures(self.errors, self.player.failures.format(rollouts=len(episodes)))
        return episodes

    async def produce(self, admitted: Callable[[int], Awaitable[bool]], deliver: Deliver) -> None:
        """Asynchronous training (rollout/producer.py): batch b = 1, 2, ... is drawn and its rollouts start once
        `await admitted(b)` allows it (False: stop), while the slowest rollouts of the batches before it may still
        run; each batch is delivered, in order, once its rollouts have all ended: `deliver(episodes, errors,
        counts, state)`, its counts those made since the delivery before, `state` the collector's right after it
        was drawn. On stop, the batches in flight are played to their end (and delivered)."""
        counted = self.player.counters()

        async def delivered_after(before: asyncio.Task | None, rollouts: asyncio.Task, errors: list[str],
                                  state: dict) -> None:
            """Batch b's delivery: after batch b - 1's, whose failure ends this one's rollouts and is raised at
            once (not once they end), then after batch b's own rollouts."""
            nonlocal counted
            try:
                if before is not None:
                    await before
                episodes = await rollouts
            finally:
                rollouts.cancel()           # a no-op once they ended
            now = self.player.counters()
            counts, counted = counted_since(counted, now), now
            log_failures(errors, self.player.failures.format(rollouts=len(episodes)))
            deliver(episodes, errors, counts, state)

        with self.player.batch():
            last, b = None, 0
            while await admitted_unless_failed(admitted(b := b + 1), last):
                tasks = [self.player.task(j, self.next_seed + j) for j in self.share]
                self.next_seed += self.n_tasks
                errors: list[str] = []
                rollouts = asyncio.create_task(self._play(tasks, errors))
                last = asyncio.create_task(delivered_after(last, rollouts, errors, self.state_dict()))
            if last is not None:
                await last

    async def _play(self, tasks: list, errors: list[str]) -> list[Episode]:
        """The rollouts of `tasks`; a game whose every seat the policy played, one episode per seat
        (rollout/seats.py)."""
        played = await asyncio.gather(*(self.player.play(task, k, errors)
                                        for task in tasks for k in range(self.group_size)))
        return [seat_episode for episode in played for seat_episode in by_seat(episode)]

    def state_dict(self) -> dict:
        return {"next_seed": self.next_seed}

    def load_state_dict(self, state: dict) -> None:
        self.next_seed = state["next_seed"]

    def close(self) -> None:
        self.player.close()


async def admitted_unless_failed(admitted: Awaitable[bool], running: asyncio.Task | None) -> bool:
    """`await admitted`, unless the batches `running` raise first: then their error (the learner waiting for them
    hears of it at once, not at the end of the run)."""
    gate = asyncio.ensure_future(admitted)
    if running is not None:
        await asyncio.wait([gate, running], return_when=asyncio.FIRST_COMPLETED)
        if running.done() and running.exception() is not None:
            gate.cancel()
            raise running.exception()
    return await gate


def counted_since(before: dict[str, int], now: dict[str, int]) -> dict[str, int]:
    """What each counter of `now` counted since `before`."""
    return {name: n - before.get(name, 0) for name, n in now.items()}
