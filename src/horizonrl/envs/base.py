"""The TextEnv protocol every environment implements.

An env speaks text: observations are strings, actions are names from `env.actions`. At the end of an
episode `info` carries `success` (bool) and `progress` (float in [0, 1]).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Instruction:
    """What the agent is told before the first observation.

    `intro` says what the agent is ("an agent playing a simple navigation game"), `mission` what to
    achieve, `actions` maps each valid action name to a one-line description, `tips` are hints.
    """

    intro: str
    mission: str
    actions: dict[str, str]
    tips: list[str] = field(default_factory=list)


@runtime_checkable
class TextEnv(Protocol):
    actions: list[str]
    default_action: str

    @property
    def instruction(self) -> Instruction: ...

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]: ...

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]: ...
