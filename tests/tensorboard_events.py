"""Reading a run's metrics back: the finite numbers of metrics records, and the scalars of its
TensorBoard events files (tests of the metrics sinks)."""

import math
from pathlib import Path


def numbers(records: list[dict]) -> dict[str, dict[int, float]]:
    """{key: {iteration: value}} of the finite numbers in records (jsonl ones: NaN is null there)."""
    out: dict[str, dict[int, float]] = {}
    for r in records:
        for key, value in r.items():
            if key != "iteration" and isinstance(value, (int, float)) and math.isfinite(value):
                out.setdefault(key, {})[r["iteration"]] = float(value)
    return out


def tensorboard_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0}).Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
