"""Synchronous vs asynchronous training (rollout.async_training.max_staleness K = 0, 1, 2) on the same work, in
one run; prints one JSON object {"learner_bound": {...}, "rollout_bound": {...}}.

    python benchmarks/async.py [--iterations 6] [--workloads learner_bound rollout_bound] [--process]

Run from the repository root. Each workload trains the same start (the same model, seeds and config but for
K) three times and reports env steps per second over iterations 2..N (`progress/env_steps` and
`progress/wall_clock_s` of metrics.jsonl: iteration 1 fills the producer's pipeline and is left out), as
`env_steps_per_s_k0`, `_k1`, `_k2`, and `speedup_k1`, `speedup_k2` (over K = 0), with the mean time the learner
waited for data and the mean staleness of each asynchronous run. The producer is a thread
(rollout.async_training.producer); `--process` runs K = 1 and 2 with a producer process as well
(keys `env_steps_per_s_k1_process`, `speedup_k1_process`, ...: over the same K = 0).

    learner_bound   the default job (configs/babyai_tiny.yaml: PPO on BabyAI, the tiny model, 2 torch threads),
                    its critic warmup cut to one batch (it is not measured)
    rollout_bound   configs/arithmetic_openai_agent.yaml (GRPO, 8 tasks x 8 rollouts, the OpenAI-API agent
                    through the gateway) with benchmarks/slow_tools_agent.py: every calculator call waits a
                    long-tailed time (its latency model is in that file). Its tiny model is warm-started once
                    (iterations=0) and every K trains from that run's init/.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from horizonrl.config import load_config
from horizonrl.report.metrics import read_metrics
from horizonrl.train.loop import train

STALENESS = (0, 1, 2)
TIS_CAP = 2.0


def workload_overrides(name: str, root: Path) -> tuple[str, list[str]]:
    """(recipe, overrides) of a workload, every K alike; the rollout-bound one warm-starts its model here."""
    if name == "learner_bound":
        return "configs/babyai_tiny.yaml", ["critic.warmup_batches=1", "critic.warmup_iters=1"]
    recipe = "configs/arithmetic_openai_agent.yaml"
    agent = ["task.agent=benchmarks/slow_tools_agent.py:agent"]
    start = train(load_config(recipe, [*agent, "iterations=0", f"output_dir={root / 'start'}"]), progress=False)
    return recipe, [*agent, f"model.path={start / 'init'}", "model.warm_start=null"]


def steps_per_s(run: Path) -> tuple[float, float, float]:
    """(env steps per second over iterations 2..N, mean async/learner_wait_s, mean async/staleness_mean) of a run."""
    records = [r for r in read_metrics(run / "metrics.jsonl") if r["iteration"] >= 1]
    first, last = records[0], records[-1]
    rate = (last["progress/env_steps"] - first["progress/env_steps"]) / (
        last["progress/wall_clock_s"] - first["progress/wall_clock_s"])
    measured = records[1:]
    wait = sum(r.get("async/learner_wait_s", r["timing/rollout_s"]) for r in measured) / len(measured)
    staleness = sum(r.get("async/staleness_mean", 0.0) for r in measured) / len(measured)
    return rate, wait, staleness


def measure(name: str, iterations: int, with_process: bool, root: Path) -> dict:
    """The workload's keys (module docstring) for every K; `with_process`: the same for K >= 1 with a producer
    process too, suffixed `_process`."""
    recipe, overrides = workload_overrides(name, root)
    runs = [(k, "thread") for k in STALENESS] + [(k, "process") for k in STALENESS[1:] if with_process]
    result = {}
    for k, producer in runs:
        suffix = "_process" if producer == "process" else ""
        cfg = load_config(recipe, [*overrides, f"iterations={iterations}", "save_every=0", f"actor.tis_cap={TIS_CAP}",
                                   f"rollout.async_training.max_staleness={k}",
                                   f"rollout.async_training.producer={producer}",
                                   f"output_dir={root / f'k{k}{suffix}'}"])
        rate, wait, staleness = steps_per_s(train(cfg, progress=False))
        result.update({f"env_steps_per_s_k{k}{suffix}": rate, f"learner_wait_s_k{k}{suffix}": wait,
                       f"staleness_mean_k{k}{suffix}": staleness})
        if k:
            result[f"speedup_k{k}{suffix}"] = rate / result["env_steps_per_s_k0"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--workloads", nargs="+", default=["learner_bound", "rollout_bound"],
                        choices=["learner_bound", "rollout_bound"])
    parser.add_argument("--process", action="store_true", help="K = 1 and 2 with a producer process as well")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        print(json.dumps({name: measure(name, args.iterations, args.process, Path(folder) / name)
                          for name in args.workloads}, indent=1))


if __name__ == "__main__":
    main()
