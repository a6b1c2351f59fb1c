"""Whether a change moved what a job computes: the same job run from two source trees (the working tree and a
git revision), its metrics.jsonl compared record by record, every key but the clock's.

    python benchmarks/same_metrics.py --base HEAD~3                       # the default job, 3 iterations
    python benchmarks/same_metrics.py --base HEAD~3 --config configs/toy.yaml --set algorithm=gigpo

A behaviour-preserving refactor (issue 62) must leave every number of the default job's first iterations equal to
1e-6. Each tree runs in its own process (`python -m horizonrl train` with PYTHONPATH at that tree's src/), the
base from a temporary `git worktree`, one after the other, one torch thread each, so the float summation order is
the same in both. Keys that read the clock (timing/*, perf/* throughput, progress/wall_clock_s, async/ waits) are
left out; everything else must be present in both and equal within --tolerance (absolute, or relative to the
larger magnitude, whichever is looser).

Prints one JSON object: {"records", "keys_compared", "max_abs_diff", "worst_key", "differences" (up to 20),
"only_in_base", "only_in_change", "equal"}; exits 1 when the metrics differ.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLOCK_PREFIXES = ("timing/", "perf/", "progress/wall_clock_s", "async/learner_wait_s", "async/producer_")


def run_job(source: Path, args: argparse.Namespace, out: Path) -> list[dict]:
    """The job's metrics records, run with the package of `source`/src."""
    command = [sys.executable, "-m", "horizonrl", "train", *([args.config] if args.config else []),
               f"iterations={args.iterations}", "threads=1", f"output_dir={out}", "save_every=1000",
               "report_to=[]", *args.set]
    env = {**os.environ, "PYTHONPATH": str(source / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=source, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{source}: `{' '.join(command)}` exited {done.returncode}:\n{done.stderr[-3000:]}")
    metrics = sorted(out.glob("*/metrics.jsonl"))
    if len(metrics) != 1:
        sys.exit(f"{source}: expected one run folder with metrics.jsonl under {out}, found {len(metrics)}")
    return [json.loads(line) for line in metrics[0].read_text().splitlines()]


def compared(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(CLOCK_PREFIXES) and isinstance(v, (int, float))}


def compare(base: list[dict], change: list[dict], tolerance: float) -> dict:
    if len(base) != len(change):
        return {"equal": False, "records": [len(base), len(change)]}
    differences, only_base, only_change, n_keys = [], set(), set(), 0
    worst = (0.0, None)
    for b, c in zip(map(compared, base), map(compared, change)):
        only_base |= b.keys() - c.keys()
        only_change |= c.keys() - b.keys()
        for key in b.keys() & c.keys():
            n_keys += 1
            x, y = float(b[key]), float(c[key])
            if math.isnan(x) and math.isnan(y):
                continue
            diff = abs(x - y)
            if diff > worst[0]:
                worst = (diff, f"{b.get('iteration')}:{key}")
            if diff > tolerance * max(1.0, abs(x), abs(y)):
                differences.append({"iteration": b.get("iteration"), "key": key, "base": x, "change": y})
    return {"records": len(base), "keys_compared": n_keys, "max_abs_diff": worst[0], "worst_key": worst[1],
            "differences": differences[:20], "only_in_base": sorted(only_base), "only_in_change": sorted(only_change),
            "equal": not differences and not only_base and not only_change}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the git revision to compare the working tree with")
    parser.add_argument("--config", default=None, help="a recipe (default: the default job)")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
    parser.add_argument("--tolerance", type=float, default=1e-6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-f", str(tree), args.base], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            base = run_job(tree, args, Path(tmp) / "runs-base")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
        change = run_job(ROOT, args, Path(tmp) / "runs-change")
    result = compare(base, change, args.tolerance)
    print(json.dumps(result, indent=1))
    sys.exit(0 if result["equal"] else 1)


if __name__ == "__main__":
    main()
