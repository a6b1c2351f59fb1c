"""Interactions: stateful feedback providers the agent loop consults after a response (verl), and
ms-swift's multi-turn scheduler hooks on top of them.

An Interaction (a simulated user, a verifier) answers each response with `Feedback`: whether the
episode ends, the text that enters the conversation (observation ids, mask 0) and a reward for the
turn. One Interaction object serves one episode, so it may keep state between turns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from horizonrl.records import Task, Turn

if TYPE_CHECKING:
    from horizonrl.rollout.agent_loop import Trajectory


@dataclass(frozen=True)
class Feedback:
    """`text` enters the conversation unless `should_terminate`; `reward` is added to the turn just
    sampled; `info` is stored in that turn's info under "interaction" (reward functions see it)."""

    should_terminate: bool
    text: str = ""
    reward: float = 0.0
    info: dict = field(default_factory=dict)


class Interaction(Protocol):
    async def start(self, task: Task) -> None: ...

    async def respond(self, trajectory: Trajectory) -> Feedback: ...


class MultiTurnScheduler:
    """ms-swift's scheduler hooks. Subclass and override `step` (and the others as needed).

    After each response the loop calls `on_turn_end`, then `check_finished` (default: the response
    was cut by max_tokens, or `max_turns` turns are done); unless finished, `step` returns the
    feedback text, or (text, extra info); the extra info is stored in the turn's info under
    "interaction", so reward functions receive it with the Episode. `current_turn` counts from 1.
    """

    def __init__(self, max_turns: int | None = None):
        self.max_turns = max_turns

    def on_trajectory_start(self, task: Task) -> None:
        """Called once, before the first response."""

    def step(self, trajectory: Trajectory, current_turn: int) -> str | tuple[str, dict]:
        raise NotImplementedError("a MultiTurnScheduler returns the next feedback from step()")

    def check_finished(self, trajectory: Trajectory, current_turn: int) -> bool:
        if trajectory.turns[-1].info.get("finish_reason") == "length":
            return True
        return bool(self.max_turns) and current_turn >= self.max_turns

    def on_turn_end(self, trajectory: Trajectory, turn: Turn, current_turn: int) -> None:
        """Called after every response that the loop hands to the scheduler."""


class SchedulerInteraction:
    """A MultiTurnScheduler driven as an Interaction."""

    def __init__(self, scheduler: MultiTurnScheduler):
        self.scheduler = scheduler

    async def start(self, task: Task) -> None:
        self.scheduler.on_trajectory_start(task)

    async def respond(self, trajectory: Trajectory) -> Feedback:
        current_turn = len(trajectory.turns)
        self.scheduler.on_turn_end(trajectory, trajectory.turns[-1], current_turn)
        if self.scheduler.check_finished(trajectory, current_turn):
            return Feedback(should_terminate=True)
        result = self.scheduler.step(trajectory, current_turn)
        text, info = result if isinstance(result, tuple) else (result, {})
        return Feedback(False, text, 0.0, info)


def as_interaction(provider: Interaction | MultiTurnScheduler) -> Interaction:
    return SchedulerInteraction(provider) if isinstance(provider, MultiTurnScheduler) else provider
