"""Another policy in a seat of a self-play game: a model from a folder, or a pool of the trained policy's past
snapshots (SPIRAL's opponent pool).

A game whose every seat asks the policy for its move (`openspiel:<game>` with `opponent: self`) is played by the
trained policy in seat `seed % 2` (so a run's seeds play both seats, as `seat: alternate` does) and by the opponent
in the other; `learner_seat` fixes the trained policy's seat instead (`horizonrl eval --opponent checkpoint:PATH`
plays each seat apart). The opponent samples from an engine of its own over the same prompts and tokenizer; its
turns carry its name (`Turn.policy`) and make no episode (rollout/seats.py): only the policy's seats are trained.

A served opponent (`selfplay.opponent_url`, rollout/from_config.served_opponent) is a SeatOpponent whose engine is
an OpenAI-compatible server's (engines/openai_server.py): a model of any size, on other machines.

`OpponentPool`: the initial policy is the pool's first member; every `snapshot_every` iterations the trained
weights join it (the oldest member leaves once it holds `size`), and after each iteration one member, drawn
uniformly (seeded by the run's seed and the iteration), plays the next batch's games.

The pool is kept in memory and saved with each checkpoint (runstate/checkpoint.py: its members' weights, the
member in play), so a resumed run goes on with the same opponents.

What it simplifies: one pool member plays a whole batch (SPIRAL draws per game), so one engine holds the
opponent's weights.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from horizonrl.engines.base import Engine


CHECKPOINT = "checkpoint:"   # `horizonrl eval --opponent checkpoint:PATH`: the model folder PATH as the opponent
SERVER = "server:"           # `--opponent server:URL`, Turn.policy of selfplay.opponent_url: a served model


class SeatOpponent:
    """`name` plays one seat of every game with `engine` (module docstring)."""

    def __init__(self, name: str, engine: Engine, learner_seat: int | None = None):
        self.name, self.engine, self.learner_seat = name, engine, learner_seat

    def plays(self, seat: int | None, seed: int) -> bool:
        """Whether this opponent plays `seat` in the game of `seed`."""
        learner = seed % 2 if self.learner_seat is None else self.learner_seat
        return seat is not None and seat != learner

    def after_update(self, iteration: int) -> dict[str, float]:
        """What changes after training iteration `iteration`: nothing for a fixed model; its metrics."""
        return {}

    def state_dict(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """What a checkpoint keeps (JSON-able, tensors): nothing for a fixed model."""
        return {}, {}

    def load_state_dict(self, state: dict, tensors: dict[str, torch.Tensor]) -> None:
        """Back to what `state_dict` gave."""


class NoOpponent(SeatOpponent):
    """The trained policy plays every seat."""

    def __init__(self):
        super().__init__("", None)

    def plays(self, seat: int | None, seed: int) -> bool:
        return False


NO_OPPONENT = NoOpponent()
Snapshot = dict[str, torch.Tensor]


class OpponentPool(SeatOpponent):
    def __init__(self, engine: Engine, snapshot: Callable[[], Snapshot], size: int, snapshot_every: int, seed: int):
        """`engine`: the one that plays the drawn member (it starts with the initial policy's weights);
        `snapshot()`: the trained policy's weights now, each tensor a copy on the CPU."""
        self.snapshot, self.size, self.snapshot_every, self.seed = snapshot, size, snapshot_every, seed
        self.members: list[tuple[str, Snapshot]] = [("pool/iter0", snapshot())]
        super().__init__(self.members[0][0], engine)

    def after_update(self, iteration: int) -> dict[str, float]:
        """Take a snapshot when `iteration` is due, then put a drawn member in the engine; returns the pool's size
        and the drawn member's iteration."""
        if iteration % self.snapshot_every == 0:
            self.members = [*self.members, (f"pool/iter{iteration}", self.snapshot())][-self.size:]
        self.name, weights = random.Random(f"pool {self.seed} {iteration}").choice(self.members)
        self.engine.sync_weights(None, weights.items())
        return {"selfplay/pool_size": len(self.members),
                "selfplay/opponent_iteration": float(self.name.removeprefix("pool/iter"))}

    def state_dict(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """The members' names and the one in play; each member's weights under "<name>/<parameter>"."""
        return ({"members": [name for name, _ in self.members], "playing": self.name},
                {f"{name}/{key}": tensor for name, weights in self.members for key, tensor in weights.items()})

    def load_state_dict(self, state: dict, tensors: dict[str, torch.Tensor]) -> None:
        self.members = [(name, {key.removeprefix(f"{name}/"): tensor for key, tensor in tensors.items()
                                if key.startswith(f"{name}/")}) for name in state["members"]]
        self.name = state["playing"]
        self.engine.sync_weights(None, dict(self.members)[self.name].items())
