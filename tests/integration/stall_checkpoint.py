"""`horizonrl train` whose checkpoint of one iteration stalls halfway through its write: the model is in
the temporary folder, the training state not yet. A test SIGKILLs it there.

    python stall_checkpoint.py ITERATION MARKER [horizonrl train arguments ...]

touches the file MARKER when the stall begins.
"""

import sys
import time
from pathlib import Path

from horizonrl.cli import main
from horizonrl.runstate.checkpoint import TrainingState


def stall_at(iteration: int, marker: Path) -> None:
    write = TrainingState.write

    def stalling_write(self, folder: Path, saved_iteration: int) -> None:
        if saved_iteration == iteration:
            marker.touch()
            time.sleep(600)
        write(self, folder, saved_iteration)

    TrainingState.write = stalling_write


if __name__ == "__main__":
    stall_at(int(sys.argv[1]), Path(sys.argv[2]))
    sys.exit(main(["train", *sys.argv[3:]]))
