"""The served-policy check (assembly/sync_check.py) on the shipped tiny policy and a real hf engine over a copy of it:
after each sync the engine and the learner score the first batch's probe rows; a sync the engine did not take
(none of it, or not its MLPs) stops at that sync, naming the engine, the version and the gap, whatever sampled the
batch. The expected log-probs come from the model's own logits (a plain forward, log_softmax), not from the code
under test."""

import copy

import pytest
import torch

from horizonrl.engines.hf import HFEngine
from horizonrl.learner.models import load_policy, pad_token_id
from horizonrl.records import Episode, Turn
from horizonrl.assembly.sync_check import EngineOutOfSync, SyncCheck


@pytest.fixture(scope="module")
def tiny():
    return load_policy("builtin:babyai-tiny", torch.device("cpu"))


def first_batch(tokenizer) -> list[Episode]:
    """Three episodes whose first turns hold a prompt and a response of the tiny tokenizer's ids."""
    texts = [("You see a wall on your left.", "THINK: turn. ACTION: turn left"),
             ("A red ball is 2 steps ahead.", "THINK: go. ACTION: go forward"),
             ("You carry a key.", "THINK: drop it. ACTION: drop")]
    return [Episode(str(n), "babyai/goto", n, turns=[Turn(tokenizer.encode(p), tokenizer.encode(r), None)])
            for n, (p, r) in enumerate(texts)]


def model_logprobs(model, episodes: list[Episode], rows: int) -> list[list[float]]:
    """The response tokens' log-probs of the first turns, from the model's full logits."""
    scores = []
    for episode in episodes[:rows]:
        turn = episode.turns[0]
        ids = torch.tensor([turn.prompt_ids + turn.response_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
        start = len(turn.prompt_ids)
        scores.append([logp[start - 1 + k, t].item() for k, t in enumerate(turn.response_ids)])
    return scores


def mean_abs(a, b) -> float:
    diffs = [abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)]
    return sum(diffs) / len(diffs)


def update(actor, scale: float = 0.02) -> None:
    """A stand-in for an optimizer step: every weight moved by `scale` of noise (seeded)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator))


def start(tiny, **options):
    tokenizer, policy = tiny
    actor, served = copy.deepcopy(policy), copy.deepcopy(policy)
    engine = HFEngine(served, pad_token_id(tokenizer), tokenizer=tokenizer)
    check = SyncCheck("the hf engine", **{"max_growth": 4.0, "min_gap": 1e-3, "probe_rows": 2, **options})
    episodes = first_batch(tokenizer)
    check.start(episodes, engine, actor)
    return actor, engine, check, episodes


def test_whole_syncs_pass_and_report_the_gap_and_the_updates_drift(tiny):
    actor, engine, check, episodes = start(tiny)
    assert len(check.rows) == 2 and check.floor < 1e-5            # same weights, fp32: rounding only
    before = model_logprobs(actor, episodes, 2)
    update(actor)
    engine.sync_weights(actor)
    metrics = check.after_sync(engine, actor)
    assert metrics["rollout/sync_probe_gap"] < 1e-5
    assert metrics["rollout/sync_probe_limit"] == 1e-3            # max(4 x floor, min_gap)
    drift = mean_abs(model_logprobs(actor, episodes, 2), before)
    assert drift > 0.05
    assert metrics["rollout/sync_probe_drift"] == pytest.approx(drift, rel=1e-4)
    assert metrics["timing/sync_probe_s"] > 0


def test_a_sync_that_never_reaches_the_engine_stops_at_that_sync(tiny):
    actor, engine, check, episodes = start(tiny)
    stale = model_logprobs(actor, episodes, 2)
    update(actor)
    engine.sync_weights(actor, tensors=[])                        # the version moves on, no weight arrives
    gap = mean_abs(model_logprobs(actor, episodes, 2), stale)
    with pytest.raises(EngineOutOfSync, match=rf"the hf engine serves other weights than the learner sent it at "
                                              rf"weights version 1: on 2 probe rows of the first batch its log-probs "
                                              rf"are {gap:.4g} per token from the learner's") as error:
        check.after_sync(engine, actor)
    assert "limit 0.001 = max(4 x that, 0.001)" in str(error.value)


def test_a_sync_without_the_mlps_stops_at_that_sync(tiny):
    actor, engine, check, _ = start(tiny)
    update(actor)
    engine.sync_weights(actor, tensors=[(n, t) for n, t in actor.state_dict().items() if ".mlp." not in n])
    with pytest.raises(EngineOutOfSync, match="weights version 1"):
        check.after_sync(engine, actor)


def test_the_limit_grows_with_the_floor(tiny):
    """A floor of bf16 rounding (here: the engine's copy in bf16) makes the limit max_growth x floor."""
    tokenizer, policy = tiny
    actor, served = copy.deepcopy(policy), copy.deepcopy(policy).to(torch.bfloat16)
    engine = HFEngine(served, pad_token_id(tokenizer), tokenizer=tokenizer)
    check = SyncCheck("the hf engine", max_growth=4.0, min_gap=1e-3, probe_rows=3)
    check.start(first_batch(tokenizer), engine, actor)
    assert check.floor > 1e-3
    engine.sync_weights(actor)
    assert check.after_sync(engine, actor)["rollout/sync_probe_limit"] == pytest.approx(4 * check.floor)


def test_a_check_turned_off_probes_nothing(tiny):
    actor, engine, check, _ = start(tiny, max_growth=None)
    update(actor)
    engine.sync_weights(actor, tensors=[])
    assert check.rows is None and check.after_sync(engine, actor) == {}
