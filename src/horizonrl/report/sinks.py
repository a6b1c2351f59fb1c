"""Metrics sinks: each iteration's record goes to every sink of `report_to`, with the same keys and the
iteration as the step.

    jsonl        runs/<name>/metrics.jsonl (report/metrics.MetricsLog): always on, listed or not
    tensorboard  runs/<name>/tensorboard/ (torch's SummaryWriter)    pip install "horizonrl[tensorboard]"
    wandb        runs/<name>/wandb/ (mode from WANDB_MODE)            pip install "horizonrl[wandb]"

jsonl keeps the whole record (NaN as null); TensorBoard and W&B get its finite numbers (int, float,
bool), the strings, lists and NaN left out. A resumed run (`first_iteration` > 0) continues the same
TensorBoard log, whose events from `first_iteration` on are dropped (purge_step), and the same W&B run
(its id is kept in runs/<name>/wandb_id). W&B drops, with a warning, a step below the run's last one
(online, a resumed run's last step is the server's), so there the iterations a resumed run writes
again keep their first values.
"""

from __future__ import annotations

import importlib.util
import math
import os
import secrets
from pathlib import Path

from horizonrl import runfolder
from horizonrl.config import ConfigError
from horizonrl.report.metrics import MetricsLog


def check_sinks(report_to: list[str]) -> None:
    """ConfigError naming the extra to install when the package of an optional sink is missing (checked
    without importing it, before a run builds anything). The names are the config's SINKS."""
    for sink in report_to:
        if sink != "jsonl" and importlib.util.find_spec(sink) is None:
            raise ConfigError(f'report_to: {sink} needs the {sink} package: pip install "horizonrl[{sink}]"')


class MetricsSinks:
    def __init__(self, run_dir: Path, report_to: list[str], config: dict, first_iteration: int = 0):
        self.jsonl = MetricsLog(run_dir / runfolder.METRICS)
        self.tensorboard = self.wandb = None
        if "tensorboard" in report_to:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(log_dir=str(run_dir / "tensorboard"),
                                             purge_step=first_iteration if first_iteration > 0 else None)
        if "wandb" in report_to:
            import wandb

            id_file = run_dir / "wandb_id"
            if not id_file.exists():
                id_file.write_text(secrets.token_hex(4))
            wandb.init(project=os.environ.get("WANDB_PROJECT", "horizonrl"), name=run_dir.name, dir=str(run_dir),
                       config=config, id=id_file.read_text().strip(), resume="allow")
            self.wandb = wandb

    def write(self, record: dict) -> None:
        self.jsonl.write(record)
        step = record["iteration"]
        scalars = {k: v for k, v in record.items()
                   if k != "iteration" and isinstance(v, (int, float)) and math.isfinite(v)}
        if self.tensorboard is not None:
            for key, value in scalars.items():
                self.tensorboard.add_scalar(key, float(value), global_step=step)
            self.tensorboard.flush()  # on disk with the jsonl line, should the run be killed
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None

    def __enter__(self) -> MetricsSinks:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
