"""The served-policy check's detection table (assembly/sync_check.py): the toy recipe, shrunk as
tests/integration/test_sync_check_run.py shrinks it, trained for 30 iterations in each mode with its weight syncs
whole or broken, and the iteration each run stopped at.

    python benchmarks/sync_check.py                   # every mode x breakage x precision (about 10 minutes)
    python benchmarks/sync_check.py --modes thread-K1 --precisions fp32

Modes: thread-K1 and process-K1 (asynchronous, max_staleness 1: the hf engine samples from a copy of its own in a
producer thread or process), lora-K0 (synchronous LoRA: the engine samples from a merged copy), full-K0
(synchronous full fine-tune: the hf engine samples from the actor itself, so no sync can go wrong and only the
healthy run is played). Breakages: `none` (every sync whole), `missing-from-1` (no weight reaches the engine from
the first sync on), `mlp-from-3` (no MLP weight from the third sync on: a partial sync), `missing-from-3` (no
weight from the third sync on: a stale engine). A broken sync k is caught at that sync when the run ends in
iteration k (the sync ends its iteration). Precisions: fp32, bf16 (autocast).

Prints one JSON object: {"<mode> <breakage> <precision>": {"stopped_at": iteration or null, "iterations": run,
"floor", "gap_max" (the largest gap of the healthy syncs), "drift_min", "limit", "probe_s_mean", "iteration_s_mean"}}.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
from pathlib import Path

from horizonrl.cli import main
from horizonrl.train import phases

TOY = ["configs/toy.yaml", "rollout.n_env=4", "ppo.e_len=4", "optim.mini_batch_size=8", "optim.epochs=1",
       "critic.warmup_batches=1", "critic.warmup_iters=1", "model.warm_start.steps=20",
       "model.warm_start.iterations=1", "actor.lr=1e-3", "save_every=100", "iterations=30", "threads=1"]
ASYNC = ["rollout.async_training.max_staleness=1", "actor.tis_cap=2.0"]
MODES = {"thread-K1": ASYNC, "process-K1": [*ASYNC, "rollout.async_training.producer=process"],
         "lora-K0": ["model.lora={r: 4, alpha: 8}"], "full-K0": []}
BREAKAGES = {"none": None, "missing-from-1": (1, lambda name: False),
             "mlp-from-3": (3, lambda name: ".mlp." not in name), "missing-from-3": (3, lambda name: False)}


def broken_syncs(first_broken: int, kept):
    """phases.merged_parameters with only the tensors `kept` says of sync `first_broken` and those after it."""
    merged, syncs = phases.merged_parameters, [0]

    def sync(actor):
        syncs[0] += 1
        return [(name, tensor) for name, tensor in merged(actor) if syncs[0] < first_broken or kept(name)]
    return sync


def run(mode: str, breakage: str, precision: str) -> dict:
    merged = phases.merged_parameters
    if BREAKAGES[breakage] is not None:
        phases.merged_parameters = broken_syncs(*BREAKAGES[breakage])
    try:
        with tempfile.TemporaryDirectory() as out, contextlib.redirect_stderr(io.StringIO()) as err:
            code = main(["train", *TOY, *MODES[mode], f"precision={precision}", f"output_dir={out}", "--quiet"])
            (folder,) = Path(out).iterdir()
            records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    finally:
        phases.merged_parameters = merged
    if code not in (0, 1) or (code == 1 and "serves other weights" not in err.getvalue()):
        raise RuntimeError(f"{mode} {breakage} {precision}: exit code {code}\n{err.getvalue()[-2000:]}")
    synced = records[1:]                        # after the critic warmup, every iteration ends with a sync
    return {"stopped_at": records[-1]["iteration"] + 1 if code == 1 else None, "iterations": records[-1]["iteration"],
            "floor": synced[0]["rollout/sync_probe_floor"] if synced else None,
            "gap_max": max(r["rollout/sync_probe_gap"] for r in synced) if synced else None,
            "drift_min": min(r["rollout/sync_probe_drift"] for r in synced) if synced else None,
            "limit": synced[0]["rollout/sync_probe_limit"] if synced else None,
            "probe_s_mean": sum(r["timing/sync_probe_s"] for r in synced) / max(len(synced), 1),
            "iteration_s_mean": sum(r["timing/update_s"] + r["timing/score_s"] + r["timing/rollout_s"]
                                    for r in synced) / max(len(synced), 1)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--breakages", nargs="+", default=list(BREAKAGES), choices=list(BREAKAGES))
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    args = parser.parse_args()
    table = {}
    for precision in args.precisions:
        for mode in args.modes:
            for breakage in args.breakages if mode != "full-K0" else ["none"]:
                table[f"{mode} {breakage} {precision}"] = result = run(mode, breakage, precision)
                print(f"{mode} {breakage} {precision}: {result}", flush=True)
    print(json.dumps(table, indent=1))
