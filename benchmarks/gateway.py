"""The gateway's cost: agents calling the model through the OpenAI API vs the same calls sent straight
to the engine, in one run; prints one JSON object.

    python benchmarks/gateway.py [--agents 32] [--calls 3] [--max-tokens 32] [--rounds 3]
    python benchmarks/gateway.py --model DIR --random-weights --device cuda     # DIR: config.json + tokenizer

Model: the shipped tiny BabyAI agent (builtin:babyai-tiny) in an hf engine, or --model (with
--random-weights, a model of that config with random weights: a GPU-sized model without a download).
Each of `agents` concurrent agents runs a chat loop of `calls` calls through `openai.AsyncOpenAI` against an
in-process Gateway on its own rollout URL, each call seeded, its reply and a new user message appended to the
conversation. The agents run on the gateway's own event loop (`same_loop`: the client's work competes with the gateway's
and the engine's for the GIL), or in a process of their own (`agents_apart`, as agents usually are).
The direct run then sends the very prompts the gateway recorded (its `prompt_ids`), with the same seeds
and token budgets, to `engine.generate`, each agent's calls in turn, all agents concurrently.
Each run gets a fresh engine over the same model (so neither reuses the other's prefix cache), rounds
alternate gateway and direct, and tokens/s (sampled tokens / wall time) are medians over rounds.

Two workloads: `fixed` ends responses at max_tokens only (the gateway is built without stop ids), so
every call samples exactly `max_tokens` tokens; `eos` is the model as served (the trained agent answers
in ~2 tokens and EOS), which shows the per-call cost of HTTP and JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import openai
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from horizonrl.config import RolloutConfig
from horizonrl.engines.base import SamplingParams
from horizonrl.gateway import Gateway, GatewayThread, Recorder
from horizonrl.learner.models import load_policy, stop_ids
from horizonrl.rollout.from_config import make_engine

SYSTEM = "You play BabyAI. Answer with ACTION: <action>."
COLORS = ["red", "green", "blue", "purple", "yellow", "grey"]


async def chat_loops(url: str, agents: int, calls: int, max_tokens: int) -> tuple[float, int]:
    """Wall time and sampled tokens of the agents' chat loops through the OpenAI client (agent i on the
    rollout URL agent-i)."""
    async def agent(client: openai.AsyncOpenAI, i: int) -> int:
        messages = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"go to the {COLORS[i % len(COLORS)]} ball"}]
        tokens = 0
        for call in range(calls):
            response = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=max_tokens,
                                                             seed=1000 * i + call)
            tokens += response.usage.completion_tokens
            messages += [response.choices[0].message.model_dump(exclude_none=True),
                         {"role": "user", "content": f"you see a wall {call + 1} steps ahead"}]
        return tokens

    clients = [openai.AsyncOpenAI(base_url=f"{url}/rollouts/agent-{i}/v1", api_key="-", max_retries=0)
               for i in range(agents)]
    start = time.perf_counter()
    tokens = sum(await asyncio.gather(*(agent(client, i) for i, client in enumerate(clients))))
    elapsed = time.perf_counter() - start
    for client in clients:
        await client.close()
    return elapsed, tokens


def chat_loops_in_this_process(url: str, agents: int, calls: int, max_tokens: int) -> tuple[float, int]:
    return asyncio.run(chat_loops(url, agents, calls, max_tokens))


def through_gateway(gateway: Gateway, agents_apart: bool, args) -> tuple[float, int]:
    """The chat loops through `gateway`: on its event loop (`agents_apart=False`), or in a process of
    their own while the gateway runs on its loop in a thread here."""
    if not agents_apart:
        async def serve_and_run():
            url = await gateway.start()
            try:
                return await chat_loops(url, args.agents, args.calls, args.max_tokens)
            finally:
                await gateway.stop()
        return asyncio.run(serve_and_run())
    thread = GatewayThread(gateway)
    url = thread.start()
    try:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            return pool.submit(chat_loops_in_this_process, url, args.agents, args.calls, args.max_tokens).result()
    finally:
        thread.stop()


async def direct(engine, prompts: list[list[list[int]]], params: SamplingParams) -> tuple[float, int]:
    """Wall time and sampled tokens of the same prompts, seeds and budgets sent to the engine itself."""
    async def agent(i: int, agent_prompts: list[list[int]]) -> int:
        generations = [await engine.generate(prompt, replace(params, seed=1000 * i + call))
                       for call, prompt in enumerate(agent_prompts)]
        return sum(len(generation.token_ids) for generation in generations)

    start = time.perf_counter()
    tokens = sum(await asyncio.gather(*(agent(i, agent_prompts) for i, agent_prompts in enumerate(prompts))))
    return time.perf_counter() - start, tokens


def measure(tokenizer, model, eos: tuple[int, ...], agents_apart: bool, args) -> dict:
    def engine():
        return make_engine(model, tokenizer, RolloutConfig(), seed=0, device=model.device)

    asyncio.run(direct(engine(), [[tokenizer.encode("warm up", add_special_tokens=False)]] * 4,
                       SamplingParams(args.max_tokens, stop_ids=eos)))
    rates = {"gateway": [], "engine": []}
    for _ in range(args.rounds):
        recorder = Recorder()
        gateway = Gateway(engine(), tokenizer, "tiny", model.config.max_position_embeddings, eos, recorder)
        elapsed, tokens = through_gateway(gateway, agents_apart, args)
        rates["gateway"].append(tokens / elapsed)
        prompts = [[call.prompt_ids for call in recorder.take(f"agent-{i}").calls] for i in range(args.agents)]
        elapsed, direct_tokens = asyncio.run(direct(engine(), prompts, SamplingParams(args.max_tokens, stop_ids=eos)))
        assert direct_tokens == tokens, (direct_tokens, tokens)   # same prompts and seeds: the same samples
        rates["engine"].append(tokens / elapsed)
        print(f"{'agents apart' if agents_apart else 'same loop'}, stop ids {eos}: gateway {rates['gateway'][-1]:.0f}"
              f" tokens/s, engine {rates['engine'][-1]:.0f} tokens/s", file=sys.stderr, flush=True)
    gateway_rate, engine_rate = statistics.median(rates["gateway"]), statistics.median(rates["engine"])
    return {"tokens_per_round": tokens, "gateway_tokens_per_s": round(gateway_rate),
            "engine_tokens_per_s": round(engine_rate), "ratio": round(gateway_rate / engine_rate, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=32)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="builtin:babyai-tiny", help="a model folder, hub id or builtin:NAME")
    parser.add_argument("--random-weights", action="store_true",
                        help="--model is a folder with config.json and a tokenizer only: random weights "
                             "(bf16 on a GPU)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    if args.random_weights:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        with device:   # initialised where it runs
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.model), dtype=dtype)
    else:
        tokenizer, model = load_policy(args.model, device)
    print(json.dumps({"model": args.model, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                      "agents": args.agents, "calls_per_agent": args.calls, "max_tokens": args.max_tokens,
                      "rounds": args.rounds,
                      **{f"{workload}_{where}": measure(tokenizer, model, eos, where == "agents_apart", args)
                         for workload, eos in [("fixed", ()), ("eos", stop_ids(tokenizer, model))]
                         for where in ("same_loop", "agents_apart")}}))


if __name__ == "__main__":
    main()
