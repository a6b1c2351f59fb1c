"""fp32 vs bf16 autocast on this machine, for one model: the learner's forward+backward throughput, and
how far the hf engine's log-probs are from the learner's under each (engine, learner) precision pair.

    python benchmarks/precision.py --model builtin:smollm2-135m-instruct
    python benchmarks/precision.py --model builtin:babyai-tiny --rows 16
    python benchmarks/precision.py --model builtin:smollm2-135m-instruct --lora

Prints one JSON object: {"fwd_bwd_tokens_per_s": {"fp32", "bf16"}, "bf16_speedup", "logprob_abs_diff":
{"engine fp32 / learner fp32": {"mean", "max", "tokens"}, ...}}. One torch thread; the timings are the best of 3.

--lora asks what LoRA adds to the gap. The learner is the model with adapters (r = 16 on every linear
layer) whose B is drawn so that each adapted weight moves by `scale` of its norm (||scaling B A|| = scale
||W||), the engine samples from the merged copy a LoRA run syncs (learner/models.engine_copy, bf16 where
autocast is), and the gaps are those of the same sampled tokens against that learner ("adapters") and
against a plain model holding the merged weights in fp32 (what a full fine-tune's learner holds):
{"lora": {scale: {"engine / learner merged", "engine / learner adapters", "learner merged / learner
adapters"}}}, all in bf16 (and "fp32" for scale 0.01 in fp32 throughout).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import time

import torch
from peft.tuners.lora import LoraLayer

from horizonrl import envs
from horizonrl.agents.agent import Agent
from horizonrl.config import LoRAConfig
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.hf import HFEngine
from horizonrl.learner.device import autocast, precision
from horizonrl.learner.lora import add_adapters
from horizonrl.learner.models import engine_copy, load_policy, pad_token_id
from horizonrl.learner.scoring import token_logprobs
from horizonrl.samples.tensors import pad

CPU = torch.device("cpu")
PAIRS = [("fp32", "fp32"), ("bf16", "bf16"), ("fp32", "bf16")]     # (engine, learner)
LORA_SCALES = (0.0, 0.001, 0.01, 0.05)      # ||scaling B A|| / ||W|| of each adapted weight


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


def sample(tokenizer, model, engine_precision: str, prompts: list[list[int]]) -> list:
    """The hf engine's Generations (token ids and their log-probs) of up to 16 tokens for each prompt."""
    engine = HFEngine(model, pad_token_id(tokenizer), seed=1,
                      autocast_dtype=torch.bfloat16 if engine_precision == "bf16" else None)
    params = SamplingParams(max_tokens=16, temperature=1.0, stop_ids=(tokenizer.eos_token_id,))

    async def run():
        return await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    generations = asyncio.run(run())
    engine.close()
    return generations


def learner_logprobs(tokenizer, learner, learner_precision: str, prompts: list[list[int]], generations: list
                     ) -> list[torch.Tensor]:
    """The learner's log-probs (learner/scoring.token_logprobs) of each prompt's sampled tokens."""
    pad_id = pad_token_id(tokenizer)
    rows = [p + g.token_ids for p, g in zip(prompts, generations)]
    masks = [[0] * len(p) + [1] * len(g.token_ids) for p, g in zip(prompts, generations)]
    with precision(learner_precision), torch.no_grad():
        logp, _ = token_logprobs(learner, pad(rows, pad_id, torch.long),
                                 pad([[1] * len(r) for r in rows], 0, torch.long), pad(masks, 0, torch.float32))
    return [logp[row, len(p):len(p) + len(g.token_ids)] for row, (p, g) in enumerate(zip(prompts, generations))]


def gap(logprobs: list[torch.Tensor], others: list[torch.Tensor]) -> dict:
    """Mean and max |a - b| over every token of the rows."""
    differences = torch.cat([(a - b).abs() for a, b in zip(logprobs, others)])
    return {"mean": float(differences.mean()), "max": float(differences.max()), "tokens": len(differences)}


def logprob_gaps(tokenizer, model, engine_precision: str, learner_precision: str, prompts: list[list[int]]) -> dict:
    """Mean and max |engine log-prob - learner log-prob| over the tokens sampled for `prompts`."""
    generations = sample(tokenizer, model, engine_precision, prompts)
    return gap(learner_logprobs(tokenizer, model, learner_precision, prompts, generations),
               [torch.tensor(g.logprobs) for g in generations])


def lora_gaps(tokenizer, model, prompts: list[list[int]], compute: str, scale: float) -> dict:
    """The --lora measurement (module docstring) at one adapter `scale`, computing in `compute`."""
    adapted, _ = add_adapters(copy.deepcopy(model), None, LoRAConfig(), seed=0)
    generator = torch.Generator().manual_seed(0)
    for layer in (module for module in adapted.modules() if isinstance(module, LoraLayer)):
        b = layer.lora_B["default"].weight
        with torch.no_grad():
            b.copy_(torch.randn(b.shape, generator=generator))
            delta = layer.scaling["default"] * b @ layer.lora_A["default"].weight
            b.mul_(scale * layer.base_layer.weight.norm() / delta.norm())
    merged = engine_copy(adapted, torch.float32, CPU).eval()
    engine = merged if compute == "fp32" else engine_copy(adapted, torch.bfloat16, CPU).eval()
    generations = sample(tokenizer, engine, compute, prompts)
    sampled = [torch.tensor(g.logprobs) for g in generations]
    merged_logprobs = learner_logprobs(tokenizer, merged, compute, prompts, generations)
    adapters_logprobs = learner_logprobs(tokenizer, adapted, compute, prompts, generations)
    return {"engine / learner merged": gap(merged_logprobs, sampled),
            "engine / learner adapters": gap(adapters_logprobs, sampled),
            "learner merged / learner adapters": gap(merged_logprobs, adapters_logprobs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--lora", action="store_true", help="what LoRA's merged engine copy adds to the gap")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer, model = load_policy(args.model, CPU)
    model.eval()
    env, agent = envs.make("babyai/goto"), Agent(tokenizer)
    prompts = [agent.prompt_ids(env, [], env.reset(seed=seed)[0]) for seed in range(8)]
    if args.lora:
        print(json.dumps({"model": args.model, "lora": {
            **{str(scale): lora_gaps(tokenizer, model, prompts, "bf16", scale) for scale in LORA_SCALES},
            "fp32": lora_gaps(tokenizer, model, prompts, "fp32", 0.01)}}))
        return
    speed = {name: fwd_bwd_tokens_per_s(model, args.rows, args.length, name) for name in ("fp32", "bf16")}
    print(json.dumps({
        "model": args.model, "rows": args.rows, "length": args.length,
        "fwd_bwd_tokens_per_s": {name: round(value, 1) for name, value in speed.items()},
        "bf16_speedup": round(speed["bf16"] / speed["fp32"], 3),
        "logprob_abs_diff": {f"engine {engine} / learner {learner}":
                             logprob_gaps(tokenizer, model, engine, learner, prompts) for engine, learner in PAIRS},
    }))


if __name__ == "__main__":
    main()
