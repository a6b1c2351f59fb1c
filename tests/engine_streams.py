"""Workloads for the hf engine's tests (tests/integration/test_engine.py, test_cuda.py): prompts, and streams
whose requests join and leave a running batch."""

import asyncio

from horizonrl.engines.base import SamplingParams


def prompts_of(tokenizer, n):
    texts = [f"You are on stone {i} of 5. The next stone is to your right." * (1 + i % 3) for i in range(n)]
    return [tokenizer.encode(t) for t in texts]


def turns_of_streams(engine, prompts):
    """Streams of different lengths decoding side by side, 3 turns each (rows leave, later turns join, reuse kept
    prefixes and get compacted; buffers grow), then one prompt alone for 80 tokens (no row leaves)."""
    async def stream(i, prompt):
        generations = []
        for turn in range(3):
            params = SamplingParams(max_tokens=4 + 28 * ((i + turn) % 3), seed=10 * i + turn)
            generations.append(await engine.generate(prompt, params))
            prompt = prompt + generations[-1].token_ids + [7, 8, 9]
        return generations

    async def run():
        return await asyncio.gather(*(stream(i, p) for i, p in enumerate(prompts)))
    alone = engine.generate_batch([prompts[0]], [SamplingParams(max_tokens=80, seed=1)])
    return [g for generations in asyncio.run(run()) for g in generations] + alone


def assert_same_samples(got, expected, tolerance=1e-6):
    """The same ids, and log-probs within `tolerance` of their size (fp32 rounding on a CPU: the fixed-shape step's
    largest gap was 9.5e-7 nats on the tiny model, docs/engines.md)."""
    assert [g.token_ids for g in got] == [g.token_ids for g in expected]
    assert all(abs(a - b) <= tolerance * max(1.0, abs(b)) for g, e in zip(got, expected)
               for a, b in zip(g.logprobs, e.logprobs))
