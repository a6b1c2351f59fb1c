"""Where the hf engine's producer runs: a thread of the learner's process (what horizonrl does) against a
process of its own, on the default job's real work, in one run; prints one JSON object.

    python benchmarks/producer_placement.py [--seconds 60] [--placements alone threads processes]

Run from the repository root. The two loads of asynchronous training on the default job
(configs/babyai_tiny.yaml: PPO on BabyAI, the tiny model; rollout.async_training.max_staleness=1, so the hf
engine samples from a copy of its own, as in training):

    learner    one fixed-turn batch (collected once) scored by actor and critic, dual-discount GAE, and the
               critic's and actor's mini-batch updates, again and again (train/ppo.py ppo_iteration but its
               rollout and its weight sync)
    producer   the fixed-turn collector's batches (16 streams x 16 turns) from the engine's copy, again and again

placed three ways:

    alone      each load in a process of its own, one after the other: the machine to itself
    threads    both at once, two threads of one process (the producer thread of rollout/producer.py)
    processes  both at once, each in a process of its own (what a producer process would be: its own
               interpreter and GIL; each process's torch uses the machine's cores, as the one process does)

Each load repeats its unit (an update; a batch) until it has run --seconds and keeps going until the other has
too, so it is measured only while the other runs. Reported per placement: `updates_per_s` and
`env_steps_per_s`; `share_of_alone`: those rates over each load's alone (a sum over 1.0 is what the overlap
gains); `threads_over_processes`: the threads' rates over the processes'. Near 1.0, a producer process would be
no faster than the thread on this machine.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import tempfile
import threading
import time
from pathlib import Path

from horizonrl.config import load_config
from horizonrl.envs.pool import open_envs
from horizonrl.learner.update import Stats, UpdateStep, minibatch_updates
from horizonrl.runstate.checkpoint import StopSignals
from horizonrl.assembly.context import RunContext, start_run
from horizonrl.train.phases import score
from horizonrl.train.ppo import estimate_advantages

RECIPE = "configs/babyai_tiny.yaml"
LOADS = ("learner", "producer")


def build(output_dir: Path) -> tuple[RunContext, list]:
    """The default job's run context with K = 1 (its collector the producer's), and its envs."""
    cfg = load_config(RECIPE, ["rollout.async_training.max_staleness=1", "actor.tis_cap=2.0",
                               f"output_dir={output_dir}"])
    envs = open_envs(cfg.env.ids, cfg.env.kwargs, cfg.rollout.n_env, cfg.env.workers, cfg.env.timeout_s)
    with StopSignals() as signals:
        return start_run(cfg, envs, signals, None), envs


def unit(ctx: RunContext, load: str):
    """A function doing one unit of `load`; it returns the env steps it played (the learner's: 0)."""
    collector = ctx.collector.collector              # the fixed-turn collector the producer plays
    if load == "producer":
        return lambda: sum(len(e.turns) for e in collector.collect())
    episodes, optim = collector.collect(), ctx.cfg.optim

    def update() -> int:
        batch = score(ctx, episodes, ctx.critic)
        estimate_advantages(batch, ctx.cfg.ppo, ctx.ranks)
        minibatch_updates(batch.rows, optim.mini_batch_size, ctx.micro_batch_budget, optim.epochs, ctx.shuffle,
                          [UpdateStep(ctx.critic_opt, ctx.critic_loss, optim.grad_clip, Stats()),
                           UpdateStep(ctx.actor_opt, ctx.actor_loss(1), optim.grad_clip, Stats())], ctx.ranks)
        return 0
    return update


def repeat(work, seconds: float, start, measured, parties: int) -> dict:
    """Run `work` from `start` (a barrier) until it has run `seconds`, then count itself in `measured` (a shared
    counter) and go on until all `parties` have; its rates over the units done by then."""
    start.wait()
    began = time.perf_counter()
    units = steps = 0
    while (elapsed := time.perf_counter() - began) < seconds:
        steps += work()
        units += 1
    with measured.get_lock():
        measured.value += 1
    while measured.value < parties:
        work()
    return {"units_per_s": units / elapsed, "env_steps_per_s": steps / elapsed, "units": units}


def in_process(loads: tuple[str, ...], seconds: float, start, measured, parties: int, output_dir: Path,
               results=None) -> dict:
    """`loads` in this process, one thread each, over one run context; to `results` (a queue) when given."""
    ctx, envs = build(output_dir)
    works = {load: unit(ctx, load) for load in loads}
    rates: dict[str, dict] = {}
    threads = [threading.Thread(target=lambda load=load: rates.update({load: repeat(
        works[load], seconds, start, measured, parties)})) for load in loads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for env in envs:
        env.close()
    if results is not None:
        results.put(rates)
    return rates


def placement(name: str, seconds: float, folder: Path) -> dict:
    """The learner's updates and the producer's env steps per second placed as `name` says (module docstring)."""
    spawn = mp.get_context("spawn")
    if name == "threads":
        rates = in_process(LOADS, seconds, spawn.Barrier(2), spawn.Value("i", 0), 2, folder / name)
    elif name == "alone":
        rates = {}
        for load in LOADS:
            rates.update(in_process((load,), seconds, spawn.Barrier(1), spawn.Value("i", 0), 1, folder / load))
    else:
        start, measured, results = spawn.Barrier(2), spawn.Value("i", 0), spawn.Queue()
        processes = [spawn.Process(target=in_process, args=((load,), seconds, start, measured, 2,
                                                            folder / f"{name}-{load}", results)) for load in LOADS]
        for process in processes:
            process.start()
        rates = {}
        for _ in processes:
            rates.update(results.get())
        for process in processes:
            process.join()
    return {"updates_per_s": rates["learner"]["units_per_s"], "env_steps_per_s": rates["producer"]["env_steps_per_s"],
            "units": {load: rates[load]["units"] for load in LOADS}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--placements", nargs="+", default=["alone", "threads", "processes"],
                        choices=["alone", "threads", "processes"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        result = {name: placement(name, args.seconds, Path(folder)) for name in args.placements}
    if "alone" in result:
        for name in {"threads", "processes"} & result.keys():
            result[name]["share_of_alone"] = {key: result[name][key] / result["alone"][key]
                                              for key in ("updates_per_s", "env_steps_per_s")}
    if {"threads", "processes"} <= result.keys():
        result["threads_over_processes"] = {key: result["threads"][key] / result["processes"][key]
                                            for key in ("updates_per_s", "env_steps_per_s")}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
