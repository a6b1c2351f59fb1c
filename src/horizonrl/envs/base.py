"""The TextEnv protocol every environment implements.

An env speaks text: observations are strings, actions are names from `env.actions`.

    reset(seed) -> (observation, info)                 the same seed gives the same episode
    step(action) -> (observation, reward, terminated, truncated, info)
        `action` is always one of `env.actions` (the agent maps invalid output to `default_action`);
        at the episode's end (terminated or truncated) `info` carries `success` (bool) and
        `progress` (float in [0, 1]); `info["metrics"]`, at any step, maps names to floats that are
        logged as `env/<name>`.
    state_key()        a short string naming the current state (what the agent faces, not the step count):
                       equal keys mean equal states; GiGPO (algos/gigpo.py) compares turns that start in one
                       state. Deterministic across processes (`state_digest`, never Python's salted hash)
    instruction        read again before every prompt, so it may change during an episode
    translations       normalised near-miss -> action name (e.g. "move forward" -> "go forward")
    map_symbols        (optional) the characters of a map the observation draws as text: a tiny model's tokenizer
                       keeps each a token of its own (assembly/warm_start.py)
    seat               (optional, a game's) the seat the current observation is for, the one that acts next. An env
                       whose one policy plays every seat (self-play) changes it from turn to turn, gives reward 0 at
                       each step and ends with `info["seat_returns"]`, each seat's return: the collector splits its
                       episodes by seat (rollout/seats.py)
    unwrapped          the simulator underneath (minigrid, crafter, ...), for tests and debugging
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np


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
    translations: dict[str, str]

    @property
    def instruction(self) -> Instruction: ...

    @property
    def unwrapped(self) -> Any: ...

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]: ...

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]: ...

    def state_key(self) -> str: ...


def has_state_key(env) -> bool:
    """Whether `env` implements state_key() (only GiGPO needs it)."""
    return callable(getattr(env, "state_key", None))


def state_digest(*parts: Any) -> str:
    """A 32-hex-digit digest of `parts` (ints, strings, bytes and tuples of them: their repr is the same in
    every process), the state key of an env whose state they are."""
    return hashlib.blake2b(repr(parts).encode(), digest_size=16).hexdigest()


class PrivateRandom:
    """The process-wide `random` and `np.random` streams of one game, for a library that seeds and draws from them
    (GEM, TextArena): inside `with private():` the game's own streams are in place and the process's set aside, so
    an episode depends only on its seed and training's random draws are never moved."""

    def __init__(self):
        self.state: tuple[Any, Any] | None = None   # the game's own (random, np.random) states

    @contextmanager
    def __call__(self) -> Iterator[None]:
        saved = random.getstate(), np.random.get_state()
        if self.state is not None:
            random.setstate(self.state[0])
            np.random.set_state(self.state[1])
        try:
            yield
        finally:
            self.state = random.getstate(), np.random.get_state()
            random.setstate(saved[0])
            np.random.set_state(saved[1])
