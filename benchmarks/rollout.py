"""Rollout throughput of the continuously batched hf engine against lockstep batches; prints one JSON object.

    python benchmarks/rollout.py [--streams 16] [--turns 8] [--repeats 5] [--workload long_tailed|uniform]

Workload (one seed, so every mode runs the same one): N streams of K turns on the toy-size tiny model
(random weights). Turn k of a stream samples a response to the stream's prompt (its first prompt, 32..96
tokens, then every response and observation so far, so it grows with the turn); the response has
exactly max_tokens tokens, drawn per stream and turn (no stop ids). Then the env steps: it sleeps for a
latency drawn per stream and turn and returns an observation of 8..24 tokens. See `make_workload` for
the two distributions.

Measures, as medians over the repeats: (1) env steps/s of the async engine (every stream its own task:
generate -> step -> generate ...) against lockstep (all prompts in one `generate_batch`, then all envs
stepped concurrently, repeat); (2) generated tokens/s of the async run against a ceiling: one batched
`model.generate` on N equal requests of the workload's mean prompt and response lengths; the async run
is also timed with every env latency set to 0, to separate the engine's own cost from waiting on envs.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import random
import statistics
import time

import torch

from horizonrl import envs
from horizonrl.config import TinyModel
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.hf import HFEngine
from horizonrl.train.warm_start import build_tiny_for_envs


@dataclasses.dataclass(frozen=True)
class Turn:
    """The response has exactly `max_tokens` tokens; the env then takes `latency_s` to answer `observation`."""

    max_tokens: int
    latency_s: float
    observation: list[int]


@dataclasses.dataclass(frozen=True)
class Stream:
    prompt: list[int]
    turns: list[Turn]


def make_workload(streams: int, turns: int, vocab: int, long_tailed: bool, seed: int = 0) -> list[Stream]:
    """Response lengths and env latencies drawn per stream and turn: uniform (4..48 tokens, 0..60 ms) or
    long-tailed as agent rollouts are (log-normal: median 12 tokens, clipped to 2..64 = max_tokens;
    median 10 ms, clipped to 0.5 s)."""
    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(n)]  # 0..2: pad, bos, eos

    def turn() -> Turn:
        if long_tailed:
            length = min(64, max(2, round(rng.lognormvariate(math.log(12), 0.8))))
            latency = min(0.5, rng.lognormvariate(math.log(0.01), 1.0))
        else:
            length, latency = rng.randint(4, 48), rng.uniform(0.0, 0.06)
        return Turn(length, latency, ids(rng.randint(8, 24)))

    return [Stream(ids(rng.randint(32, 96)), [turn() for _ in range(turns)]) for _ in range(streams)]


def without_latency(workload: list[Stream]) -> list[Stream]:
    return [Stream(s.prompt, [dataclasses.replace(t, latency_s=0.0) for t in s.turns]) for s in workload]


async def env_step(prompt: list[int], response: list[int], turn: Turn) -> list[int]:
    """The env answers after `turn.latency_s`; returns the stream's next prompt."""
    await asyncio.sleep(turn.latency_s)
    return prompt + response + turn.observation


async def run_async(engine: HFEngine, workload: list[Stream]) -> None:
    async def stream(s: Stream):
        prompt = s.prompt
        for turn in s.turns:
            generation = await engine.generate(prompt, SamplingParams(turn.max_tokens))
            prompt = await env_step(prompt, generation.token_ids, turn)

    await asyncio.gather(*(stream(s) for s in workload))


async def run_lockstep(engine: HFEngine, workload: list[Stream]) -> None:
    prompts = [s.prompt for s in workload]
    for k in range(len(workload[0].turns)):
        turns = [s.turns[k] for s in workload]
        generations = engine.generate_batch(prompts, [SamplingParams(t.max_tokens) for t in turns])
        steps = (env_step(p, g.token_ids, t) for p, g, t in zip(prompts, generations, turns))
        prompts = await asyncio.gather(*steps)


def median_seconds(runs: dict, repeats: int) -> dict[str, float]:
    """Median wall time of each run; the runs take turns, so a changing load on the machine hits all alike."""
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(t) for name, t in times.items()}


def ceiling_request(model, workload: list[Stream]) -> tuple[torch.Tensor, int]:
    """N equal prompts of the workload's mean prompt length (random ids) and its mean response length."""
    prompt_lengths = []
    for s in workload:  # the prompt of turn k: first prompt + earlier responses and observations
        length = len(s.prompt)
        for t in s.turns:
            prompt_lengths.append(length)
            length += t.max_tokens + len(t.observation)
    new_tokens = round(statistics.mean(t.max_tokens for s in workload for t in s.turns))
    input_ids = torch.randint(3, model.config.vocab_size, (len(workload), round(statistics.mean(prompt_lengths))))
    return input_ids, new_tokens


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workload", choices=["long_tailed", "uniform"], default="long_tailed")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer, model = build_tiny_for_envs([envs.make("river")], TinyModel(), seed=0, device=torch.device("cpu"))
    workload = make_workload(args.streams, args.turns, len(tokenizer), args.workload == "long_tailed")
    pad_id, steps = tokenizer.pad_token_id, args.streams * args.turns
    tokens = sum(t.max_tokens for s in workload for t in s.turns)

    ceiling_ids, ceiling_tokens = ceiling_request(model, workload)
    engine = lambda: HFEngine(model, pad_id, seed=0)  # noqa: E731  (a fresh, identically seeded one per run)
    runs = {
        "lockstep": lambda: asyncio.run(run_lockstep(engine(), workload)),
        "async": lambda: asyncio.run(run_async(engine(), workload)),
        "async_no_latency": lambda: asyncio.run(run_async(engine(), without_latency(workload))),
        "ceiling": lambda: model.generate(ceiling_ids, attention_mask=torch.ones_like(ceiling_ids), do_sample=True,
                                          max_new_tokens=ceiling_tokens, min_new_tokens=ceiling_tokens),
    }
    median_seconds(runs, 1)  # warm up
    seconds = median_seconds(runs, args.repeats)
    ceiling = ceiling_ids.shape[0] * ceiling_tokens / seconds["ceiling"]
    result = {
        "workload": args.workload, "streams": args.streams, "turns": args.turns, "generated_tokens": tokens,
        # lockstep waits for the slowest stream of every turn: its decode steps and its env wait
        "lockstep/decode_steps": sum(max(s.turns[k].max_tokens for s in workload) for k in range(args.turns)),
        "lockstep/env_wait_s": sum(max(s.turns[k].latency_s for s in workload) for k in range(args.turns)),
        # no engine can take fewer decode steps than the longest stream has tokens
        "async/min_decode_steps": max(sum(t.max_tokens for t in s.turns) for s in workload),
        "lockstep/env_steps_per_s": steps / seconds["lockstep"], "async/env_steps_per_s": steps / seconds["async"],
        "env_steps_speedup": seconds["lockstep"] / seconds["async"],
        "async/tokens_per_s": tokens / seconds["async"],
        "async_no_latency/tokens_per_s": tokens / seconds["async_no_latency"], "ceiling/tokens_per_s": ceiling,
        "tokens_per_s_vs_ceiling": tokens / seconds["async"] / ceiling,
        "no_latency_tokens_per_s_vs_ceiling": tokens / seconds["async_no_latency"] / ceiling,
    }
    print(json.dumps({"torch_threads": torch.get_num_threads(), **result}, indent=1))


if __name__ == "__main__":
    main()
