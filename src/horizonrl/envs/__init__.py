"""Environment registry: `make(env_id, **kwargs)` builds a TextEnv by id."""

from __future__ import annotations

from collections.abc import Callable

from horizonrl.envs.base import Instruction, TextEnv
from horizonrl.envs.river import River

REGISTRY: dict[str, Callable[..., TextEnv]] = {
    "river": River,
}


def make(env_id: str, **kwargs) -> TextEnv:
    """Build the env registered as `env_id`; an unknown id is one clear error listing the known ones."""
    if env_id not in REGISTRY:
        raise ValueError(f"unknown env {env_id!r}; known envs: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[env_id](**kwargs)


__all__ = ["Instruction", "REGISTRY", "TextEnv", "make"]
