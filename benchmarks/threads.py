"""Torch's thread count on a CPU, alone and beside a busy neighbour: SmolLM2-135M's decode speed in the hf
engine and the learner's forward+backward speed, per thread setting; prints one JSON object.

    python benchmarks/threads.py [--rounds 2] [--repeats 5] [--neighbours 0 1] [--configs 1 2 default ...]

Run from the repository root. Each configuration runs in a process of its own (the OpenMP runtime reads
OMP_WAIT_POLICY and GOMP_SPINCOUNT when it loads, before any Python of ours runs):

    1, 2, ...        torch.set_num_threads(N)
    default          what torch picks by itself (no call; OMP_NUM_THREADS unset)
    2-passive        2 threads, OMP_WAIT_POLICY=PASSIVE (a waiting OpenMP thread sleeps at once)
    2-spin1000       2 threads, GOMP_SPINCOUNT=1000 (libgomp's own spin when threads outnumber the cores)

Each configuration is measured with 0 neighbours (the machine as it is) and beside N neighbours: processes
running `while True: pass`, pinned to nothing, started before the measured process and killed after it.
Two workloads, in the measured process:

    decode   the hf engine (HFEngine, prefix cache off) answering one request at a time: a 426-token chat
             prompt, 48 greedy new tokens (no stop id); tokens/s = 48 / the request's wall time (prefill included:
             what a gateway's client sees)
    train    forward + next-token loss + backward over [2, 128] random ids (the learner's pass), tokens/s

`repeats` of each after one warm-up (its speed reported apart: a gateway's first replies); a workload starts no
new repeat after --budget-s seconds and a measured process still running after --max-s is stopped (a collapsed
configuration would take many minutes), keeping what it measured by then. Reported per configuration and
neighbour count: the median over every repeat of every round, the slowest and fastest repeat, and the 1-minute
load average before the neighbours started (other people's work on a shared machine). Rounds run the
configurations in alternating order.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time

CONFIGS = {   # name -> (threads or None for torch's default, extra environment)
    "1": (1, {}),
    "2": (2, {}),
    "default": (None, {}),
    "2-passive": (2, {"OMP_WAIT_POLICY": "PASSIVE"}),
    "2-spin1000": (2, {"GOMP_SPINCOUNT": "1000"}),
}
MODEL = "builtin:smollm2-135m-instruct"
OMP_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "HORIZONRL_THREADS")


def measure(threads: int | None, repeats: int, budget_s: float, model_name: str) -> None:
    """In the measured process: print one JSON line per decode request and per forward+backward pass, as each
    ends (the parent reads them as they come, and keeps those it got if it has to stop this process). Each
    workload starts no new repeat once it has run `budget_s` seconds (a collapsed one would take minutes)."""
    import torch

    from horizonrl.engines.base import SamplingParams
    from horizonrl.engines.hf import HFEngine
    from horizonrl.learner.models import load_policy, pad_token_id

    if threads is not None:
        torch.set_num_threads(threads)
    tokenizer, model = load_policy(model_name, torch.device("cpu"))
    model.eval()
    engine = HFEngine(model, pad_token_id(tokenizer), prefix_cache_tokens=0)
    text = " ".join(f"Room {i}: a red key lies north of the grey door, a blue ball east of it." for i in range(18))
    params = SamplingParams(max_tokens=48, temperature=0.0)

    def prompt(i: int) -> list[int]:
        messages = [{"role": "user", "content": f"Game {i}. {text} Which way to the key?"}]
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)

    async def request(i: int) -> tuple[float, int]:
        started = time.perf_counter()
        generation = await engine.generate(prompt(i), params)
        return time.perf_counter() - started, len(generation.token_ids)

    def say(**fields) -> None:
        print(json.dumps(fields), flush=True)

    say(threads=torch.get_num_threads(), prompt_tokens=len(prompt(0)))
    began = time.perf_counter()
    for i in range(repeats + 1):   # the first: a warm-up, reported apart (the first replies a gateway gives)
        seconds, tokens = asyncio.run(request(i))
        say(**{"decode_warmup" if i == 0 else "decode": tokens / seconds})
        if i and time.perf_counter() - began > budget_s:
            say(decode_cut=True)
            break
    engine.close()
    ids = torch.randint(0, model.config.vocab_size, (2, 128), generator=torch.Generator().manual_seed(0))
    began = time.perf_counter()
    for i in range(repeats + 1):
        if i > 1 and time.perf_counter() - began > budget_s:
            say(train_cut=True)
            break
        started = time.perf_counter()
        logits = model(input_ids=ids).logits
        loss = -logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).mean()
        loss.backward()
        model.zero_grad(set_to_none=True)
        say(**{"train_warmup" if i == 0 else "train": ids.numel() / (time.perf_counter() - started)})


def run_config(name: str, neighbours: int, args) -> dict:
    """Measure configuration `name` in a process of its own beside `neighbours` busy processes; a measured
    process still running after --max-s is stopped, and what it reported by then is kept (`cut`)."""
    threads, extra = CONFIGS[name]
    env = {key: value for key, value in os.environ.items() if key not in OMP_VARIABLES}
    env.update(extra)
    load = os.getloadavg()[0]
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(neighbours)]
    result = {"decode": [], "train": [], "decode_warmup": [], "train_warmup": [], "decode_cut": False,
              "train_cut": False}
    started = time.perf_counter()
    child = None
    try:
        child = subprocess.Popen([sys.executable, __file__, "--child", str(threads), "--repeats", str(args.repeats),
                                  "--budget-s", str(args.budget_s), "--model", args.model],
                                 env=env, stdout=subprocess.PIPE, text=True)
        timer = threading.Timer(args.max_s, child.kill)
        timer.start()
        for line in child.stdout:
            for key, value in json.loads(line).items():
                if isinstance(result.get(key), list):
                    result[key].append(value)
                else:
                    result[key] = value
        timer.cancel()
        result["cut"] = child.wait() != 0
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        for process in busy:
            process.kill()
            process.wait()
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["load_1min_before"] = round(load, 2)
    return result


def summary(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"median": round(statistics.median(values), 1), "min": round(min(values), 1),
            "max": round(max(values), 1), "n": len(values)}


def machine() -> dict:
    import torch

    with open("/proc/cpuinfo") as cpuinfo:
        model_name = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "?")
    info = torch.__config__.parallel_info()
    return {"cpu": model_name, "cores_usable": len(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(),
            "torch": torch.__version__, "torch_default_threads": torch.get_num_threads(),
            "parallel_backend": next((line.split(":", 1)[1].strip() for line in info.splitlines()
                                      if "parallel backend" in line), "?"),
            "openmp_runtime": "GNU libgomp" if "libgomp" in open(f"/proc/{os.getpid()}/maps").read() else "?",
            "python": platform.python_version()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=60.0,
                        help="a workload starts no new repeat after this many seconds")
    parser.add_argument("--max-s", type=float, default=300.0,
                        help="a measured process still running after this many seconds is stopped")
    parser.add_argument("--neighbours", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        measure(None if args.child == "None" else int(args.child), args.repeats, args.budget_s, args.model)
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # so that `finally` stops the neighbours
    started = datetime.datetime.now().astimezone()
    runs: dict[tuple[str, int], list[dict]] = {}
    for round_ in range(args.rounds):
        order = args.configs if round_ % 2 == 0 else args.configs[::-1]
        for name in order:
            for neighbours in args.neighbours:
                result = run_config(name, neighbours, args)
                runs.setdefault((name, neighbours), []).append(result)
                print(f"round {round_} {name:>10} beside {neighbours}: decode {result['decode_warmup']} then "
                      f"{[round(v, 1) for v in result['decode']]} tok/s, train "
                      f"{[round(v) for v in result['train']]} tok/s, {result['seconds']} s"
                      f"{' (cut)' if result['cut'] else ''}, load before {result['load_1min_before']}",
                      file=sys.stderr, flush=True)
    table = {}
    for (name, neighbours), results in runs.items():
        table.setdefault(name, {})[f"beside_{neighbours}"] = {
            "torch_threads": results[0].get("threads"),
            "decode_tokens_per_s": summary([v for r in results for v in r["decode"]]),
            "decode_first_request_tokens_per_s": [round(v, 1) for r in results for v in r["decode_warmup"]],
            "train_tokens_per_s": summary([v for r in results for v in r["train"]]),
            "decode_median_per_round": [round(statistics.median(r["decode"]), 1) if r["decode"] else None
                                        for r in results],
            "killed_after_s": [r["seconds"] if r["cut"] else None for r in results],
            "cut_by_budget": [[k for k in ("decode", "train") if r[f"{k}_cut"]] for r in results],
            "load_1min_before": [r["load_1min_before"] for r in results]}
    print(json.dumps({
        "command": "python " + " ".join(sys.argv), "date": started.isoformat(timespec="seconds"),
        "machine": machine(), "model": args.model,
        "prompt_tokens": next((r["prompt_tokens"] for rs in runs.values() for r in rs if "prompt_tokens" in r), None),
        "new_tokens": 48, "rounds": args.rounds, "repeats": args.repeats, "budget_s": args.budget_s,
        "max_s": args.max_s, "load_at_start": open("/proc/loadavg").read().split()[:3],
        "configs": {name: {"threads": CONFIGS[name][0] or "torch default", **CONFIGS[name][1]}
                    for name in args.configs},
        "table": table}, indent=1))


if __name__ == "__main__":
    main()
