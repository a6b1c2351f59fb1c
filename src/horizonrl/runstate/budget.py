"""What a run has spent, and when its budget is spent.

`budget.env_steps` counts the env steps (turns) of every rank, the PPO critic warmup's included;
`budget.wall_clock_s` counts the seconds since the first iteration began, over every resume. A run
stops after the iteration that reaches either (its last checkpoint and report are written as for the
last of `iterations`), so runs of different algorithms can be given equal budgets.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from horizonrl.config import BudgetConfig


@dataclass
class Progress:
    env_steps: int = 0
    wall_clock_s: float = 0.0       # spent before this process took the run over
    _since: float = field(default_factory=time.perf_counter, repr=False)

    def advance(self, env_steps: int) -> dict[str, float]:
        """Count an iteration's env steps; returns the progress/ metrics."""
        self.env_steps += env_steps
        return {"progress/env_steps": self.env_steps, "progress/wall_clock_s": self.elapsed()}

    def elapsed(self) -> float:
        return self.wall_clock_s + time.perf_counter() - self._since

    def spent(self, budget: BudgetConfig) -> bool:
        """Whether either limit of `budget` has been reached."""
        return (budget.env_steps is not None and self.env_steps >= budget.env_steps) or \
            (budget.wall_clock_s is not None and self.elapsed() >= budget.wall_clock_s)

    def state_dict(self) -> dict:
        return {"env_steps": self.env_steps, "wall_clock_s": self.elapsed()}

    def load_state_dict(self, state: dict) -> None:
        self.env_steps, self.wall_clock_s = state["env_steps"], state["wall_clock_s"]
        self._since = time.perf_counter()
