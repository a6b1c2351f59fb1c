"""Envs that misbehave on purpose, importable by worker processes (tests of the env pool)."""

import time

from horizonrl.envs.river import River


class FlakyRiver(River):
    """River whose second step raises on `crash_seed` and hangs on `hang_seed`."""

    def __init__(self, crash_seed: int = -1, hang_seed: int = -1, **kwargs):
        super().__init__(**kwargs)
        self.crash_seed, self.hang_seed = crash_seed, hang_seed
        self.seed = None

    def reset(self, seed: int):
        self.seed = seed
        return super().reset(seed)

    def step(self, action: str):
        if self.steps == 1 and self.seed == self.crash_seed:
            raise RuntimeError("simulator exploded")
        if self.steps == 1 and self.seed == self.hang_seed:
            time.sleep(600)
        return super().step(action)


class ResetFailsRiver(River):
    """River whose reset raises from env seed `fail_from` on, below `fail_below` (a run's later training seeds:
    its first batches and its warm start play)."""

    def __init__(self, fail_from: int, fail_below: int, **kwargs):
        super().__init__(**kwargs)
        self.fail_from, self.fail_below = fail_from, fail_below

    def reset(self, seed: int):
        if self.fail_from <= seed < self.fail_below:
            raise RuntimeError(f"the simulator refused seed {seed}")
        return super().reset(seed)
