"""fp32 vs bf16 autocast on this machine, for one model: the learner's forward+backward throughput, and
how far the hf engine's log-probs are from the learner's under each (engine, learner) precision pair.

    python benchmarks/precision.py --model builtin:smollm2-135m-instruct
    python benchmarks/precision.py --model builtin:babyai-tiny --rows 16

Prints one JSON object: {"fwd_bwd_tokens_per_s": {"fp32", "bf16"}, "bf16_speedup", "logprob_abs_diff":
{"engine fp32 / learner fp32": {"mean", "max"}, ...}}. One torch thread; the timings are the best of 3.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import torch

from horizonrl import envs
from horizonrl.agents.agent import Agent
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.hf import HFEngine
from horizonrl.learner.device import autocast, precision
from horizonrl.learner.models import load_policy, pad_token_id
from horizonrl.learner.scoring import token_logprobs
from horizonrl.samples.tensors import pad

CPU = torch.device("cpu")
PAIRS = [("fp32", "fp32"), ("bf16", "bf16"), ("fp32", "bf16")]     # (engine, learner)


def fwd_bwd_tokens_per_s(model, rows: int, length: int, compute: str) -> float:
    """Tokens per second of forward + next-token log-likelihood + backward over [rows, length] random ids."""
    input_ids = torch.randint(0, model.config.vocab_size, (rows, length), generator=torch.Generator().manual_seed(0))
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        with precision(compute), autocast(CPU):
            logits = model(input_ids=input_ids).logits.float()
        loss = -logits[:, :-1].log_softmax(-1).gather(-1, input_ids[:, 1:, None]).mean()
        loss.backward()
        best = min(best, time.perf_counter() - started)
        model.zero_grad(set_to_none=True)
    return rows * length / best


def logprob_gaps(tokenizer, model, engine_precision: str, learner_precision: str, prompts: list[list[int]]) -> dict:
    """Mean and max |engine log-prob - learner log-prob| over the tokens sampled for `prompts`."""
    pad_id = pad_token_id(tokenizer)
    engine = HFEngine(model, pad_id, seed=1, autocast_dtype=torch.bfloat16 if engine_precision == "bf16" else None)
    params = SamplingParams(max_tokens=16, temperature=1.0, stop_ids=(tokenizer.eos_token_id,))

    async def run():
        return await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    generations = asyncio.run(run())
    engine.close()
    rows = [p + g.token_ids for p, g in zip(prompts, generations)]
    masks = [[0] * len(p) + [1] * len(g.token_ids) for p, g in zip(prompts, generations)]
    with precision(learner_precision), torch.no_grad():
        logp, _ = token_logprobs(model, pad(rows, pad_id, torch.long), pad([[1] * len(r) for r in rows], 0, torch.long),
                                 pad(masks, 0, torch.float32))
    gaps = torch.cat([(logp[row, len(p):len(p) + len(g.token_ids)] - torch.tensor(g.logprobs)).abs()
                      for row, (p, g) in enumerate(zip(prompts, generations))])
    return {"mean": float(gaps.mean()), "max": float(gaps.max()), "tokens": len(gaps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--length", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer, model = load_policy(args.model, CPU)
    model.eval()
    speed = {name: fwd_bwd_tokens_per_s(model, args.rows, args.length, name) for name in ("fp32", "bf16")}
    env, agent = envs.make("babyai/goto"), Agent(tokenizer)
    prompts = [agent.prompt_ids(env, [], env.reset(seed=seed)[0]) for seed in range(8)]
    print(json.dumps({
        "model": args.model, "rows": args.rows, "length": args.length,
        "fwd_bwd_tokens_per_s": {name: round(value, 1) for name, value in speed.items()},
        "bf16_speedup": round(speed["bf16"] / speed["fp32"], 3),
        "logprob_abs_diff": {f"engine {engine} / learner {learner}":
                             logprob_gaps(tokenizer, model, engine, learner, prompts) for engine, learner in PAIRS},
    }))


if __name__ == "__main__":
    main()
