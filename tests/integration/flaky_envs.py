"""Envs for tests, importable by worker and producer processes: ones that misbehave on purpose (tests of the env
pool, of a run whose resets fail), and one that logs the steps a producer plays."""

import threading
import time
from pathlib import Path

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


class ProducerStepsRiver(River):
    """River that appends a line to the file `steps_file` at each step a producer plays (in its thread,
    "horizonrl-producer", of the learner's process or of a producer process); the warm start's steps are not
    logged. A test reads from it how far the producer has got."""

    def __init__(self, steps_file: str, **kwargs):
        super().__init__(**kwargs)
        self.steps_file = Path(steps_file)

    def step(self, action: str):
        if threading.current_thread().name == "horizonrl-producer":
            with self.steps_file.open("a") as steps:
                steps.write("step\n")
        return super().step(action)
