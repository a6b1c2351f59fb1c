"""Your own gymnasium env as a TextEnv.

    def make_lake(**kwargs):     # module level, so worker processes can import it
        return GymnasiumTextEnv(gymnasium.make("FrozenLake-v1", **kwargs), instruction, describe=lake_text)
    horizonrl.envs.register("lake", make_lake)

Action names map to a `Discrete` space by position (`actions[i]` is action i) or are passed through as
strings to a `Text` space. `describe` turns an observation into text (default `str`). At the end of an
episode `success` is `info["success"]` when the env gives one, else "terminated with a positive
reward"; `progress` is `info["progress"]`, else 1.0 on success and 0.0 otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from horizonrl.envs.base import Instruction, state_digest


class GymnasiumTextEnv:
    def __init__(self, env, instruction: Instruction, describe: Callable[[Any], str] = str,
                 default_action: str | None = None, translations: dict[str, str] | None = None):
        from gymnasium import spaces

        self.env, self._instruction, self.describe = env, instruction, describe
        self.actions = list(instruction.actions)
        self.default_action = default_action or self.actions[0]
        self.translations = translations or {}
        self.shown = ""                 # the last observation text
        if isinstance(env.action_space, spaces.Discrete):
            if env.action_space.n != len(self.actions):
                raise ValueError(f"instruction names {len(self.actions)} actions but the env's Discrete space has "
                                 f"{env.action_space.n}")
            self._to_env = {name: int(env.action_space.start) + i for i, name in enumerate(self.actions)}
        elif isinstance(env.action_space, spaces.Text):
            self._to_env = {name: name for name in self.actions}
        else:
            raise ValueError(f"unsupported action space {env.action_space}: use Discrete or Text")
        if self.default_action not in self._to_env:
            raise ValueError(f"default action {self.default_action!r} is not one of {self.actions}")

    @property
    def instruction(self) -> Instruction:
        return self._instruction

    @property
    def unwrapped(self):
        return self.env.unwrapped

    def reset(self, seed: int) -> tuple[str, dict]:
        observation, info = self.env.reset(seed=seed)
        self.shown = self.describe(observation)
        return self.shown, dict(info)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if action not in self._to_env:
            raise ValueError(f"unknown action {action!r}; valid: {self.actions}")
        observation, reward, terminated, truncated, info = self.env.step(self._to_env[action])
        info = dict(info)
        if terminated or truncated:
            success = bool(info.get("success", terminated and reward > 0))
            info.update(success=success, progress=float(info.get("progress", float(success))))
        self.shown = self.describe(observation)
        return self.shown, float(reward), bool(terminated), bool(truncated), info

    def state_key(self) -> str:
        """The last observation text: a gymnasium env's state is what `describe` shows of it."""
        return state_digest(self.shown)

    def close(self) -> None:
        self.env.close()
