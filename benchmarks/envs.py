"""Env speed, in this process and through worker processes; prints one JSON object.

    python benchmarks/envs.py [--steps 200] [--workers 4] [ENV_ID ...]

For each env: mean reset seconds and steps/s in-process (one env, uniformly random actions, resetting
at episode end), and aggregate steps/s of `--workers` envs in worker processes stepped concurrently
from one event loop (the collector's situation), with the ratio pool / in-process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

from horizonrl import envs
from horizonrl.envs.pool import open_envs


def in_process(env_id: str, steps: int) -> dict:
    env, rng = envs.make(env_id), random.Random(0)
    started = time.perf_counter()
    env.reset(0)
    resets, reset_s = 1, time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(rng.choice(env.actions))
        if terminated or truncated:
            t = time.perf_counter()
            env.reset(resets)
            resets, reset_s = resets + 1, reset_s + time.perf_counter() - t
    elapsed = time.perf_counter() - started
    return {"reset_s": reset_s / resets, "steps_per_s": steps / elapsed}


def through_pool(env_id: str, steps: int, workers: int) -> float:
    handles = open_envs(env_id, {}, workers, workers=True, timeout_s=120)

    async def drive(handle, index):
        rng = random.Random(index)
        await handle.reset(index)
        for step in range(steps):
            _, _, terminated, truncated, _ = await handle.step(rng.choice(handle.actions))
            if terminated or truncated:
                await handle.reset(index + workers * (step + 1))

    async def run_all():
        await asyncio.gather(*(drive(h, i) for i, h in enumerate(handles)))

    try:
        started = time.perf_counter()
        asyncio.run(run_all())
        return workers * steps / (time.perf_counter() - started)
    finally:
        for handle in handles:
            handle.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("env_ids", nargs="*", default=None)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    results = {}
    for env_id in args.env_ids or sorted(envs.REGISTRY):
        try:
            envs.factory(env_id)
        except ValueError as error:          # its optional package is not installed
            results[env_id] = {"skipped": str(error)}
            continue
        result = in_process(env_id, args.steps)
        result["pool_steps_per_s"] = through_pool(env_id, args.steps, args.workers)
        result["pool_speedup"] = result["pool_steps_per_s"] / result["steps_per_s"]
        results[env_id] = result
    print(json.dumps({"workers": args.workers, "steps": args.steps, "envs": results}, indent=1))


if __name__ == "__main__":
    main()
