"""River: the toy multi-turn task a tiny model learns on a CPU in minutes.

The agent crosses a river on `stones` stepping stones. Each observation says on which side the next
stone lies; `jump left` / `jump right` to the wrong side drops the agent in the river and it swims
back to the bank (the stones stay where they are); `wait` does nothing. Reaching the far bank gives
reward 1 and ends the episode; after `max_steps` turns it is truncated with reward 0.

No fixed action sequence works: the agent must read each observation. With the defaults an optimal
episode takes 5 turns and a uniformly random policy succeeds in about 12% of episodes (measured by
tests/unit/test_river.py).
"""

from __future__ import annotations

import random

from horizonrl.envs.base import Instruction, state_digest

ACTIONS = {
    "jump left": "jump to the stone on your left",
    "jump right": "jump to the stone on your right",
    "wait": "stay where you are",
}


class River:
    actions = list(ACTIONS)
    default_action = "wait"
    translations = {"jump to the left": "jump left", "jump to the right": "jump right", "left": "jump left",
                    "right": "jump right"}

    def __init__(self, stones: int = 5, max_steps: int = 16):
        if stones < 1 or max_steps < stones:
            raise ValueError(f"need 1 <= stones <= max_steps, got stones={stones}, max_steps={max_steps}")
        self.stones, self.max_steps = stones, max_steps
        self.sides: list[str] = []
        self.position = self.steps = 0

    @property
    def unwrapped(self) -> River:
        return self

    @property
    def instruction(self) -> Instruction:
        return Instruction(
            intro="You are an agent crossing a river on stepping stones",
            mission="reach the far bank",
            actions=dict(ACTIONS),
            tips=["the observation tells you on which side the next stone is",
                  "a wrong jump drops you in the river and you swim back to the bank"],
        )

    def reset(self, seed: int) -> tuple[str, dict]:
        rng = random.Random(seed)
        self.sides = [rng.choice(["left", "right"]) for _ in range(self.stones)]
        self.position = self.steps = 0
        return self._observation(), {}

    def state_key(self) -> str:
        """Where the agent stands on which river."""
        return state_digest(self.position, tuple(self.sides))

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}; valid: {self.actions}")
        self.steps += 1
        metrics = {}
        fell = False
        if action != "wait":
            correct = action == f"jump {self.sides[self.position]}"
            metrics["correct_jump"] = float(correct)
            self.position = self.position + 1 if correct else 0
            fell = not correct
        success = self.position == self.stones
        truncated = not success and self.steps >= self.max_steps
        info = {"metrics": metrics}
        if success or truncated:
            info.update(success=success, progress=self.position / self.stones)
        observation = "You reached the far bank." if success else self._observation(fell)
        return observation, float(success), success, truncated, info

    def _observation(self, fell: bool = False) -> str:
        where = "You are on the bank." if self.position == 0 else f"You are on stone {self.position} of {self.stones}."
        target = "far bank" if self.position == self.stones - 1 else "next stone"
        lines = [where, f"The {target} is to your {self.sides[self.position]}."]
        if fell:
            lines.insert(0, "You fell into the river and swam back to the bank.")
        return "\n".join(lines)
