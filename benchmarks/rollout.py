"""Rollout throughput of the continuously batched hf engine against lockstep batches; prints one JSON object.

    python benchmarks/rollout.py [--streams 16] [--turns 8] [--repeats 5] [--workload long_tailed|uniform]
    python benchmarks/rollout.py --model DIR [--streams 16] [--turns 8] [--max-tokens 16] [--autocast bf16]
                                 [--kv-cache both]

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

With `--model DIR` (a transformers model folder, e.g. a pretrained chat model) it measures instead the
engine's cost per turn on BabyAI prompts as the default agent builds them; see `turn_cost`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import math
import random
import statistics
import time

import torch
from transformers.cache_utils import DynamicLayer

from horizonrl import envs
from horizonrl.agents import HistoryEntry
from horizonrl.config import AgentConfig, TinyModel
from horizonrl.engines import kv_cache
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.hf import HFEngine
from horizonrl.learner.models import load_policy, pad_token_id
from horizonrl.rollout.from_config import make_agent
from horizonrl.assembly.warm_start import build_tiny_for_envs


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


def turn_cost(model_dir: str, streams: int, turns: int, max_tokens: int, autocast: torch.dtype | None) -> dict:
    """Seconds (wall, and CPU of this process: steadier on a shared machine) and forward work per turn of
    an `HFEngine` on `model_dir` playing BabyAI goto with the default agent (`AgentConfig()`: history=window,
    so every prompt is rebuilt: system prompt with the episode's mission, the last turn, the new observation).
    Each turn submits every stream's prompt at once, samples exactly `max_tokens` tokens (no stop ids,
    temperature 1) and steps every env with the parsed action. In the last turn a quarter of the streams
    start a new episode, as streams whose episodes end do. The engine keeps its KV across turns, as within
    one weights version of a run; `positions_run` counts rows x new tokens of every forward pass (padding
    included), `sampled_digest` hashes every sampled token."""
    tokenizer, model = load_policy(model_dir, torch.device("cpu"))
    engine = HFEngine(model, pad_token_id(tokenizer), seed=0, autocast_dtype=autocast)
    agent, params = make_agent(tokenizer, AgentConfig()), SamplingParams(max_tokens, temperature=1.0)
    games = [envs.make("babyai/goto") for _ in range(streams)]
    observations = [game.reset(seed=i)[0] for i, game in enumerate(games)]
    histories = [[] for _ in games]
    positions = []   # rows x new tokens of every forward pass, padding included
    model.register_forward_pre_hook(lambda module, args, kwargs: positions.append(kwargs["input_ids"].numel()),
                                    with_kwargs=True)
    sampled, report = hashlib.sha256(), []
    for turn in range(turns):
        if turn == turns - 1:
            for i in range(0, streams, 4):
                observations[i], histories[i] = games[i].reset(seed=streams + i)[0], []
        prompts = [agent.prompt_ids(g, h, o) for g, h, o in zip(games, histories, observations)]
        del positions[:]
        started, cpu_started = time.perf_counter(), time.process_time()
        generations = asyncio.run(_gather(engine, prompts, params))
        report.append({"turn": turn + 1, "seconds": round(time.perf_counter() - started, 2),
                       "cpu_seconds": round(time.process_time() - cpu_started, 2),
                       "prompt_tokens": sum(map(len, prompts)), "forward_passes": len(positions),
                       "positions_run": sum(positions)})
        for i, (game, generation) in enumerate(zip(games, generations)):
            sampled.update(str(generation.token_ids).encode())
            decision, plan = agent.decide(game, generation.token_ids)
            histories[i].append(HistoryEntry(observations[i], plan))
            observation, _, terminated, truncated, _ = game.step(decision.action)
            if terminated or truncated:
                observation, histories[i] = game.reset(seed=1000 + 100 * turn + i)[0], []
            observations[i] = observation
    return {"model": model_dir, "autocast": str(autocast), "streams": streams, "max_tokens": max_tokens,
            "turns": report, "sampled_digest": sampled.hexdigest()[:16]}


async def _gather(engine: HFEngine, prompts: list[list[int]], params: SamplingParams):
    return await asyncio.gather(*(engine.generate(p, params) for p in prompts))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workload", choices=["long_tailed", "uniform"], default="long_tailed")
    parser.add_argument("--model", help="measure the cost per turn of this model folder instead (see turn_cost)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--autocast", choices=["bf16"], help="with --model: sample under bf16 autocast")
    parser.add_argument("--kv-cache", choices=["growing", "both"], default="growing",
                        help="with --model, both: the turn cost with transformers' DynamicLayer (which copies the "
                             "cache at every step), then with engines/kv_cache's GrowingLayer, and their ratio")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.model:
        autocast = torch.bfloat16 if args.autocast else None
        if args.kv_cache == "growing":
            print(json.dumps(turn_cost(args.model, args.streams, args.turns, args.max_tokens, autocast), indent=1))
            return
        costs = {}
        for name, layer in (("dynamic", DynamicLayer), ("growing", kv_cache.GrowingLayer)):
            kv_cache.LAYER = layer
            costs[name] = turn_cost(args.model, args.streams, args.turns, args.max_tokens, autocast)
        cpu = {name: sum(t["cpu_seconds"] for t in cost["turns"]) for name, cost in costs.items()}
        same = costs["dynamic"]["sampled_digest"] == costs["growing"]["sampled_digest"]
        print(json.dumps({**costs, "same_samples": same, "cpu_seconds": cpu,
                          "cpu_seconds_dynamic_over_growing": cpu["dynamic"] / cpu["growing"]}, indent=1))
        return
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
