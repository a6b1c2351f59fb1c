"""Throughput of the toy recipe (configs/toy.yaml) on this machine; prints one JSON object.

    python benchmarks/toy_throughput.py [--iterations 10]

Measures, in one run: (1) the training loop — seconds per PPO iteration and its split, rollout and
training tokens/s, from metrics.jsonl of a short toy run; (2) the hf engine's batching — tokens/s when
the 16 streams' requests are batched (max_batch_size=16) against one request at a time, as a ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time

import torch

from horizonrl import envs
from horizonrl.agents.agent import Agent
from horizonrl.config import SOURCE_CONFIGS, load_config
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.hf import HFEngine
from horizonrl.learner.models import load_policy
from horizonrl.report.metrics import read_metrics
from horizonrl.train.loop import train


def loop_throughput(iterations: int, output_dir: str):
    cfg = load_config(SOURCE_CONFIGS / "toy.yaml", [f"iterations={iterations}", f"output_dir={output_dir}"])
    run_dir = train(cfg, progress=False)
    records = read_metrics(run_dir / "metrics.jsonl")[1:]
    median = lambda key: statistics.median(r[key] for r in records)  # noqa: E731
    seconds = [r["timing/rollout_s"] + r["timing/score_s"] + r["timing/update_s"] for r in records]
    result = {"iterations": len(records), "s_per_iteration": statistics.median(seconds),
              **{key: median(key) for key in ("timing/rollout_s", "timing/score_s", "timing/update_s",
                                              "perf/rollout_tokens_per_s", "perf/train_tokens_per_s")}}
    return result, run_dir / "init"


def engine_batching(model_dir, streams: int = 16, max_tokens: int = 32) -> dict:
    tokenizer, model = load_policy(str(model_dir), torch.device("cpu"))
    env, agent = envs.make("river"), Agent(tokenizer)
    prompts = [agent.prompt_ids(env, [], env.reset(seed)[0]) for seed in range(streams)]
    params = SamplingParams(max_tokens, stop_ids=(tokenizer.eos_token_id,))

    def tokens_per_s(max_batch_size: int) -> float:
        engine = HFEngine(model, tokenizer.pad_token_id, max_batch_size=max_batch_size)

        async def run():
            return await asyncio.gather(*(engine.generate(p, params) for p in prompts))

        started = time.perf_counter()
        generations = asyncio.run(run())
        return sum(len(g.token_ids) for g in generations) / (time.perf_counter() - started)

    tokens_per_s(streams)  # warm up
    batched, sequential = tokens_per_s(streams), tokens_per_s(1)
    return {"engine/batched_tokens_per_s": batched, "engine/sequential_tokens_per_s": sequential,
            "engine/batching_speedup": batched / sequential}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as output_dir:
        result, init_dir = loop_throughput(args.iterations, output_dir)
        result.update(engine_batching(init_dir))
    print(json.dumps({"torch_threads": torch.get_num_threads(), **result}, indent=1))


if __name__ == "__main__":
    main()
