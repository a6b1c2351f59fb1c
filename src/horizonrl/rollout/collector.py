"""The Collector protocol: what a training iteration collects its episodes from.

FixedTurnCollector (PPO: n_env streams x e_len turns, episodes cut at the batch boundary) and GroupCollector
(group algorithms: n_tasks tasks x group_size whole episodes, rollout/groups.py, whose players are env
episodes, agent-loop tasks and the user's own OpenAI-API agents through the gateway) have this shape.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

from horizonrl.records import Episode

Deliver = Callable[[list[Episode], list[str], dict[str, int], dict], None]
"""What a collector's `produce` hands each batch to: (episodes, errors, counts, the collector's state after it)."""


@runtime_checkable
class Collector(Protocol):
    errors: list[str]
    """The failures of the last `collect`, one cause each (an env error recovered from, which closed its
    episode; a failed agent); summarised in one warning per batch (rollout/failures.py)."""
    counts: dict[str, int]
    """Counters of the last `collect`, each added to the iteration's record under its name, summed over the
    ranks: the agent groups' gateway counters (`gateway/requests`, ...); none for the others."""

    def collect(self) -> list[Episode]:
        """One training batch of episodes (or episode fragments)."""
        ...

    async def produce(self, admitted: Callable[[int], Awaitable[bool]], deliver: Deliver) -> None:
        """Asynchronous training (rollout/producer.py): batch after batch, batch b = 1, 2, ... starting once
        `await admitted(b)` allows it (False: stop), each handed to `deliver`, in order, when it has ended."""
        ...

    def state_dict(self) -> dict:
        """Between `collect` calls: what decides the next batch (JSON-able)."""
        ...

    def load_state_dict(self, state: dict) -> None: ...

    def close(self) -> None:
        """Stop what the collector started (the agent groups' gateway); it is not used again."""
        ...
