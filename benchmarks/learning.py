"""The learning table: algorithms compared by held-out success after equal budgets, over seeds; prints one JSON object.

    python benchmarks/learning.py --suite toy [--algorithms ppo,grpo,gigpo] [--seeds 0,1,2] [--jobs 2]
    python benchmarks/learning.py --suite babyai --algorithms ppo --seeds 0-7 --jobs 2   # the default job's spread
    python benchmarks/learning.py --suite babyai [--env-steps N] [--wall-clock-s S] [--episodes 64] [--out DIR]
    python benchmarks/learning.py --suite toy --algorithms ppo,grpo --seeds 0 --iterations 2 --episodes 4 --jobs 2
    python benchmarks/learning.py --suite toy --set rollout.async_training.max_staleness=1 --set actor.tis_cap=2

A cell is (suite, algorithm, seed). It is three subprocesses, each with OMP_NUM_THREADS=1, at most --jobs cells at
once: `horizonrl train RECIPE seed=S algorithm=A ...` (the suite's recipe as it is; the group algorithms get the
suite's GROUP settings), stopped by the budget, budget.env_steps or budget.wall_clock_s, whichever comes first (the
same for every run; --iterations K replaces it, for smoke tests); then `horizonrl eval` of the run's final checkpoint,
of its initial policy (RUN/init) and, when its validation kept one (`--set validation.every=5`), of the best
policy on the validation seeds (RUN/best), --episodes held-out episodes per task, greedy and sampled.

Written under --out (default runs/learning-<suite>): runs/ (the run folders), logs/<cell>.log (the subprocesses'
output), cells/<cell>.json (a finished cell: its training and diagnostic curves, its final and initial held-out
success and the failure types of the failed held-out episodes; a cell whose JSON exists is not run again, and a run
folder without one is resumed from its last checkpoint, or started afresh if it saved none), learning.json (every
cell and the aggregate over seeds), learning.md (the table over seeds, then per seed its results and its
diagnostics) and learning.svg
(training success vs env steps per task: the mean over seeds of each algorithm, and its min-max band). The printed
JSON is the aggregate.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
# Per suite: the recipe; the default budget of every run, env steps (the ppo critic warmup's turns included) that
# ppo reaches in about 7 / 30 minutes on one core here (toy: 8 x 256 warmup + 40 x 256; babyai: the default job,
# 4 x 256 + 80 x 256), and a wall clock that stops only a run much slower than that; the group algorithms' batch:
# 8 seeds x 8 rollouts of at most max_turns turns (ppo collects n_env x e_len = 256 turns per iteration: toy
# 32 x 8, babyai 16 x 16; a group batch is 2-4x that at the start, ~13 / ~17 turns per episode, less once solved).
# `group_optim`: optim settings of the group algorithms. On babyai a group batch of ~1100 turns in the recipe's
# mini-batches of 64 is ~35 optimiser steps per iteration against ppo's 8, and GRPO and GiGPO drift (entropy
# 0.27 -> 1-2 in 8 iterations, success flat); mini-batches of 256 keep it near ppo's and they learn (BENCHMARKS.md).
SUITES = {
    "toy": {"recipe": "configs/toy.yaml", "env_steps": 12288, "wall_clock_s": 900,
            "group": {"n_tasks": 8, "group_size": 8, "max_turns": 14}, "group_optim": {}},
    "babyai": {"recipe": "configs/babyai_tiny.yaml", "env_steps": 21504, "wall_clock_s": 2400,
               "group": {"n_tasks": 8, "group_size": 8, "max_turns": 24}, "group_optim": {"mini_batch_size": 256}},
}
MODES = ("greedy", "sampled")
COLORS = {"ppo": "#1f77b4", "grpo": "#ff7f0e", "gigpo": "#2ca02c"}


def cell_overrides(suite: str, algorithm: str, seed: int, args) -> list[str]:
    """The cell's settings: the `key=value` overrides of its `horizonrl train`, output_dir aside.

    Under a budget, `iterations` is the most iterations the env-step budget allows (ppo: n_env x e_len turns per
    iteration; a group batch: at least one turn per episode), so the budget always stops the run first, and the
    run's bound on training seeds (rollout/seeds.max_training_episodes counts iterations) keeps eval's held-out
    seeds valid."""
    settings = SUITES[suite]
    recipe = yaml.safe_load((ROOT / settings["recipe"]).read_text())
    group = settings["group"]
    overrides = [f"seed={seed}", f"algorithm={algorithm}", f"name={suite}-{algorithm}-seed{seed}", *args.set]
    if algorithm != "ppo":
        overrides += [f"group.{key}={value}" for key, value in group.items()]
        overrides += [f"optim.{key}={value}" for key, value in settings["group_optim"].items()]
    if args.iterations is not None:
        return overrides + [f"iterations={args.iterations}"]
    turns = recipe["rollout"]["n_env"] * recipe["ppo"]["e_len"] if algorithm == "ppo" else \
        group["n_tasks"] * group["group_size"]
    return overrides + [f"budget.env_steps={args.env_steps}", f"budget.wall_clock_s={args.wall_clock_s}",
                        f"iterations={math.ceil(args.env_steps / turns)}"]


def run_cell(suite: str, algorithm: str, seed: int, args) -> dict:
    """The cell's record (cells/<cell>.json): read if it exists, else made by training (or resuming) and
    evaluating the run. Raises RuntimeError naming the log when a subprocess fails."""
    name = f"{suite}-{algorithm}-seed{seed}"
    cell_file, log = args.out / "cells" / f"{name}.json", args.out / "logs" / f"{name}.log"
    if cell_file.exists():
        return json.loads(cell_file.read_text())
    overrides = cell_overrides(suite, algorithm, seed, args)
    log.parent.mkdir(parents=True, exist_ok=True)

    def horizonrl(*command: str) -> None:
        with log.open("a") as out:
            print(f"$ horizonrl {' '.join(command)}", file=out, flush=True)
            rc = subprocess.run([sys.executable, "-m", "horizonrl", *command], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": "1"}).returncode
        if rc:
            raise RuntimeError(f"{name}: `horizonrl {' '.join(command)}` exited with {rc}; see {log}")

    runs = sorted((args.out / "runs").glob(f"{name}-*"))   # <name>-<time>[-n]: the last one is the newest
    if runs and (runs[-1] / "checkpoint" / "config.json").is_file():
        print(f"{name}: trained, evaluating {runs[-1]}", file=sys.stderr)
    elif runs and any(p.name[5:].isdigit() for p in (runs[-1] / "checkpoints").glob("iter_*")):
        print(f"{name}: resuming {runs[-1]}", file=sys.stderr)
        horizonrl("train", "--quiet", "--resume", str(runs[-1]))
    else:
        print(f"{name}: training", file=sys.stderr)
        recipe = ROOT / SUITES[suite]["recipe"]
        horizonrl("train", "--quiet", str(recipe), *overrides, f"output_dir={args.out / 'runs'}")
        runs = sorted((args.out / "runs").glob(f"{name}-*"))
    run_dir = runs[-1]
    kept = ["checkpoint", "init"] + (["best"] if (run_dir / "best").is_dir() else [])
    for which in kept:
        horizonrl("eval", str(run_dir / which), "--episodes", str(args.episodes))
    evals = {which: json.loads((run_dir / f"eval-{which}.json").read_text()) for which in kept}
    tasks = list(evals["checkpoint"]["modes"]["greedy"]["envs"])
    success = {which: {mode: {task: e["modes"][mode]["envs"][task]["success_rate"] for task in tasks}
                       for mode in MODES} for which, e in evals.items()}
    failures = {which: {mode: {task: e["modes"][mode]["envs"][task]["failures"] for task in tasks} for mode in MODES}
                for which, e in evals.items()}
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curve = training_curve(records, tasks)
    cell = {"cell": name, "suite": suite, "algorithm": algorithm, "seed": seed, "run_dir": str(run_dir),
            "overrides": overrides, "episodes": args.episodes, "tasks": tasks, "iterations": records[-1]["iteration"],
            "env_steps": curve["env_steps"][-1], "wall_clock_s": curve["wall_clock_s"][-1],
            "final": success["checkpoint"], "init": success["init"], "best": success.get("best"),
            "failures": {"final": failures["checkpoint"], "init": failures["init"], "best": failures.get("best")},
            "curve": curve, "diagnostics": diagnostic_curves(records, tasks), "validation": validations(run_dir)}
    cell_file.parent.mkdir(parents=True, exist_ok=True)
    cell_file.with_suffix(".tmp").write_text(json.dumps(cell, indent=1) + "\n")
    cell_file.with_suffix(".tmp").replace(cell_file)
    return cell


def training_curve(records: list[dict], tasks: list[str]) -> dict:
    """Per iteration record (metrics.jsonl): `env_steps` and `wall_clock_s`, cumulative (the records'
    `progress/env_steps` and `progress/wall_clock_s`; where a record lacks them, the running sums of `env/turns`
    and of its `timing/*_s` laps, which leave out the run's setup), and `success_rate[task]`, the training
    success of the episodes that finished in the iteration (`env/success_rate` for one task, `env/<task>/success_rate`
    for several; None where none finished)."""
    curve = {"env_steps": [], "wall_clock_s": [], "success_rate": {task: [] for task in tasks}}
    turns = seconds = 0.0
    for record in records:
        turns += record["env/turns"]
        seconds += sum(value for key, value in record.items() if key.startswith("timing/"))
        curve["env_steps"].append(record.get("progress/env_steps", turns))
        curve["wall_clock_s"].append(record.get("progress/wall_clock_s", seconds))
        for task in tasks:
            key = "env/success_rate" if len(tasks) == 1 else f"env/{task}/success_rate"
            curve["success_rate"][task].append(record.get(key))
    return curve


# metrics.jsonl keys whose curves a cell keeps beside its success (what may separate a seed that fails from one
# that learns): the policy's entropy, its KL to the sampling policy and to the reference, the critic's explained
# variance (PPO; absent for the group algorithms)
DIAGNOSTICS = ("train/actor/entropy", "train/actor/approx_kl", "train/kl_ref", "train/critic/explained_variance")


def diagnostic_curves(records: list[dict], tasks: list[str]) -> dict:
    """Per iteration record: each DIAGNOSTICS key's value (None where the record lacks it) and, per task, the
    episodes that finished (`env/<task>/episodes` with several tasks, `env/episodes` with one; None where absent)."""
    curves = {key: [record.get(key) for record in records] for key in DIAGNOSTICS}
    for task in tasks:
        key = "env/episodes" if len(tasks) == 1 else f"env/{task}/episodes"
        curves[f"episodes/{task}"] = [record.get(key) for record in records]
    return curves


def validations(run_dir: Path) -> list[dict]:
    """The run's validations (RUN/validation.jsonl, train/validation.py): iteration, greedy success per task and
    their mean, whether it was the best so far; [] for a run without validation."""
    path = run_dir / "validation.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return [{"iteration": v["iteration"], "success_rate": v["success_rate"], "best": v["best"],
             "envs": {task: r["success_rate"] for task, r in v["envs"].items()}} for v in lines]


def parse_seeds(text: str) -> list[int]:
    """Seeds from "0,1,2", "0-7" or "0-3,8": comma-separated seeds and inclusive ranges."""
    seeds = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        seeds += range(int(first), int(last or first) + 1)
    return seeds


def spread(values: list[float]) -> dict:
    """{"mean", "min", "max"} of `values`."""
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values)}


def aggregate(cells: list[dict], algorithms: list[str]) -> dict:
    """Per algorithm (with a finished cell), over its seeds: the spread of the final and the initial held-out
    success per mode and task, and of the env steps, wall-clock seconds and iterations of a run."""
    result = {}
    for algorithm in algorithms:
        mine = [c for c in cells if c["algorithm"] == algorithm]
        if not mine:
            continue
        result[algorithm] = {
            "seeds": [c["seed"] for c in mine],
            **{which: {mode: {task: spread([c[which][mode][task] for c in mine]) for task in mine[0]["tasks"]}
                       for mode in MODES} for which in ("final", "init")},
            **{key: spread([c[key] for c in mine]) for key in ("env_steps", "wall_clock_s", "iterations")},
        }
    return result


def markdown_table(by_algorithm: dict, episodes: int) -> str:
    """One row per algorithm; per task and mode `init -> final [min, max]` (held-out success, means over seeds,
    the final's range over seeds), then the env steps, wall-clock seconds and iterations of a run: mean [min, max]."""
    tasks = list(next(iter(by_algorithm.values()))["final"]["greedy"])
    header = ["algorithm", "seeds", *(f"{task} {mode}" for task in tasks for mode in MODES),
              "env steps", "wall-clock s", "iterations"]
    lines = [f"Held-out success ({episodes} episodes per task and mode): init -> final [min, max over seeds].", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for algorithm, a in by_algorithm.items():
        cells = [algorithm, str(len(a["seeds"]))]
        cells += [f"{a['init'][mode][task]['mean']:.2f} -> {a['final'][mode][task]['mean']:.2f} "
                  f"[{a['final'][mode][task]['min']:.2f}, {a['final'][mode][task]['max']:.2f}]"
                  for task in tasks for mode in MODES]
        cells += [f"{a[key]['mean']:.0f} [{a[key]['min']:.0f}, {a[key]['max']:.0f}]"
                  for key in ("env_steps", "wall_clock_s", "iterations")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def seed_table(cells: list[dict]) -> str:
    """One row per cell (algorithm, seed): its held-out success per task, greedy and sampled, and the failure types
    of its failed greedy episodes per task (FAILURE_TYPES order: invalid output / loop / time-out / other)."""
    tasks = cells[0]["tasks"]
    header = ["algorithm", "seed", *(f"{task} {mode}" for task in tasks for mode in MODES),
              *(f"{task} greedy failures" for task in tasks), *(f"{task} greedy, best/" for task in tasks)]
    lines = ["Per seed: held-out success of the final policy; its greedy failures as invalid output / loop / time-out "
             "/ other; the greedy success of the policy its validation kept (best/; - without validation).", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c in sorted(cells, key=lambda c: (c["algorithm"], c["seed"])):
        row = [c["algorithm"], str(c["seed"]), *(f"{c['final'][mode][task]:.3f}" for task in tasks for mode in MODES)]
        row += [" / ".join(str(n) for n in c["failures"]["final"]["greedy"][task].values()) for task in tasks]
        row += [f"{c['best']['greedy'][task]:.3f}" if c["best"] else "-" for task in tasks]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def diagnostics_table(cells: list[dict], last: int = 10) -> str:
    """One row per cell: per task its training success over its `last` iterations and its finished episodes
    over the run, the means of the DIAGNOSTICS curves over its `last` iterations (iteration 0, the critic warmup,
    left out of all), and the iteration of the validation that chose best/ (- without validation)."""
    tasks = cells[0]["tasks"]
    names = {"train/actor/entropy": "entropy", "train/actor/approx_kl": "approx KL", "train/kl_ref": "KL to ref",
             "train/critic/explained_variance": "explained var."}
    header = ["algorithm", "seed", *(f"{task} success, last {last}" for task in tasks),
              *(f"{task} episodes" for task in tasks), *(f"{name}, last {last}" for name in names.values()),
              "best/ from iteration"]
    lines = [f"Per seed, what may separate the runs: training success and episodes per task, means of the last {last} "
             "iterations.", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c in sorted(cells, key=lambda c: (c["algorithm"], c["seed"])):
        d, rates = c["diagnostics"], c["curve"]["success_rate"]
        row = [c["algorithm"], str(c["seed"])]
        for task in tasks:   # episode-weighted over the last iterations
            pairs = [(r, n) for r, n in zip(rates[task][1:][-last:], d[f"episodes/{task}"][1:][-last:])
                     if r is not None and n]
            row.append(f"{sum(r * n for r, n in pairs) / sum(n for _, n in pairs):.2f}" if pairs else "-")
        row += [str(sum(n for n in d[f"episodes/{task}"][1:] if n)) for task in tasks]
        for key in names:
            values = [v for v in d[key][1:][-last:] if v is not None]
            row.append(f"{sum(values) / len(values):.3g}" if values else "-")
        chosen = [v["iteration"] for v in c["validation"] if v["best"]]
        row.append(str(chosen[-1]) if chosen else "-")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def band(curves: list[dict], task: str, points: int = 50) -> tuple[np.ndarray, ...]:
    """(env steps, mean, min, max) over seeds of the training success of `task`, each seed's curve linearly
    interpolated (iterations where none finished left out, seeds where none ever did too) at `points` env steps
    spanning the range every seed covers."""
    xy = [[(x, y) for x, y in zip(c["env_steps"], c["success_rate"][task]) if y is not None] for c in curves]
    xy = [pairs for pairs in xy if pairs]
    grid = np.linspace(max(pairs[0][0] for pairs in xy), min(pairs[-1][0] for pairs in xy), points)
    ys = np.array([np.interp(grid, *zip(*pairs)) for pairs in xy])
    return grid, ys.mean(0), ys.min(0), ys.max(0)


def svg_plot(cells: list[dict], algorithms: list[str], width: int = 420, height: int = 280) -> str:
    """An SVG of the training success vs env steps, one panel per task, one line per algorithm (`band`), the
    success axis 0..1 (SVG text like report/plots.py: no plotting dependency)."""
    tasks, (left, right, top, bottom) = cells[0]["tasks"], (44, 12, 28, 40)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width * len(tasks)}" height="{height}" '
             'font-family="sans-serif" font-size="11">']
    for p, task in enumerate(tasks):
        curves = {a: [c["curve"] for c in cells if c["algorithm"] == a] for a in algorithms}
        bands = {a: band(curves[a], task) for a in algorithms
                 if any(y is not None for curve in curves[a] for y in curve["success_rate"][task])}
        if not bands:
            continue
        x1 = max(b[0][-1] for b in bands.values())
        sx = lambda x: p * width + left + x / x1 * (width - left - right)  # noqa: E731, B023 (used in this pass)
        sy = lambda y: height - bottom - y * (height - top - bottom)  # noqa: E731
        parts += [f'<text x="{p * width + width / 2}" y="16" text-anchor="middle">{task}: training success</text>',
                  f'<path d="M{sx(0)},{sy(1)} V{sy(0)} H{sx(x1)}" stroke="black" fill="none"/>',
                  f'<text x="{sx(0) - 4}" y="{sy(1) + 4}" text-anchor="end">1</text>',
                  f'<text x="{sx(0) - 4}" y="{sy(0)}" text-anchor="end">0</text>',
                  f'<text x="{sx(0)}" y="{sy(0) + 14}" text-anchor="start">0</text>',
                  f'<text x="{sx(x1)}" y="{sy(0) + 14}" text-anchor="end">{x1:.0f}</text>',
                  f'<text x="{sx(x1 / 2)}" y="{sy(0) + 28}" text-anchor="middle">env steps</text>']
        for k, (algorithm, (grid, mean, low, high)) in enumerate(bands.items()):
            color = COLORS.get(algorithm, "gray")
            outline = [*zip(grid, high), *zip(grid[::-1], low[::-1])]
            parts += [f'<polygon points="{points(outline, sx, sy)}" fill="{color}" fill-opacity="0.2"/>',
                      f'<polyline points="{points(zip(grid, mean), sx, sy)}" stroke="{color}" fill="none"/>',
                      f'<text x="{sx(0) + 8}" y="{sy(1) + 12 + 13 * k}" fill="{color}">{algorithm}</text>']
    return "\n".join(parts + ["</svg>"]) + "\n"


def points(xy, sx, sy) -> str:
    """SVG `points` text of (x, y) data pairs mapped by sx, sy."""
    return " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in xy)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--suite", choices=SUITES, default="toy")
    parser.add_argument("--algorithms", default="ppo,grpo,gigpo")
    parser.add_argument("--seeds", default="0,1,2", help="e.g. 0,1,2 or 0-7 (see parse_seeds)")
    parser.add_argument("--env-steps", type=int, help="budget of every run (default: the suite's, SUITES)")
    parser.add_argument("--wall-clock-s", type=float, help="budget of every run (default: the suite's, SUITES)")
    parser.add_argument("--iterations", type=int, help="train this many iterations instead of the budget (smoke tests)")
    parser.add_argument("--episodes", type=int, default=64, help="held-out episodes per task and mode")
    parser.add_argument("--out", type=Path, help="default runs/learning-<suite>")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an override of every cell's run (repeatable), e.g. "
                             "rollout.async_training.max_staleness=1")
    parser.add_argument("--jobs", type=int, choices=(1, 2), default=1, help="cells run at once")
    parser.add_argument("--plot", action=argparse.BooleanOptionalAction, default=True, help="write learning.svg")
    args = parser.parse_args()
    args.env_steps = args.env_steps or SUITES[args.suite]["env_steps"]
    args.wall_clock_s = args.wall_clock_s or SUITES[args.suite]["wall_clock_s"]
    args.out = (args.out or Path(f"runs/learning-{args.suite}")).resolve()
    algorithms, seeds = args.algorithms.split(","), parse_seeds(args.seeds)
    for done in sorted((args.out / "cells").glob("*.json")):   # one table: every cell with the same settings
        cell = json.loads(done.read_text())
        expected = cell_overrides(cell["suite"], cell["algorithm"], cell["seed"], args)
        if (cell["overrides"], cell["episodes"]) != (expected, args.episodes):
            parser.error(f"{done} was run with other settings ({' '.join(cell['overrides'])}, {cell['episodes']} "
                         "episodes); use another --out")
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_cell, args.suite, a, s, args) for a in algorithms for s in seeds]
        try:
            wait(futures)
        except KeyboardInterrupt:   # the running cells' trainers got the SIGINT too: they save a checkpoint and stop
            pool.shutdown(cancel_futures=True)
            raise
    cells, failed = [], []
    for future in futures:
        try:
            cells.append(future.result())
        except RuntimeError as error:
            print(error, file=sys.stderr)
            failed.append(str(error))
    result = {"suite": args.suite, "recipe": SUITES[args.suite]["recipe"], "episodes": args.episodes,
              "budget": {"iterations": args.iterations} if args.iterations is not None else
              {"env_steps": args.env_steps, "wall_clock_s": args.wall_clock_s},
              "group": SUITES[args.suite]["group"], "group_optim": SUITES[args.suite]["group_optim"], "failed": failed,
              "algorithms": aggregate(cells, algorithms)}
    (args.out / "learning.json").write_text(json.dumps({**result, "cells": cells}, indent=1) + "\n")
    if cells:
        (args.out / "learning.md").write_text(markdown_table(result["algorithms"], args.episodes) + "\n"
                                              + seed_table(cells) + "\n" + diagnostics_table(cells))
    if cells and args.plot:
        (args.out / "learning.svg").write_text(svg_plot(cells, algorithms))
    print(json.dumps(result, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
