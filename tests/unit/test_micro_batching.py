"""Micro-batches by rows or by a token budget: packing, exact gradient accumulation for every loss
aggregation, scoring in any packing, and the out-of-memory retry with half the budget."""

import copy
import dataclasses
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, LlamaConfig

from horizonrl.config import SOURCE_CONFIGS, MicroBatchBudget, load_config
from horizonrl.learner.models import ValueModel
from horizonrl.learner.scoring import pack_rows, pack_shared_rows, prompt_values, score
from horizonrl.learner.update import Stats, UpdateStep, actor_loss_fn, minibatch_updates, optimizer_step
from horizonrl.plan import GIB, auto_token_budget
from horizonrl.samples.tensors import Rows
from horizonrl.assembly.context import micro_batch_budget

TOY = SOURCE_CONFIGS / "toy.yaml"

LENGTHS = [300, 17, 120, 64, 5, 230, 90, 41, 150, 12]     # one row longer than the 256 budget
VOCAB = 64


def test_pack_rows_by_hand():
    assert pack_rows([5, 3, 9, 2], MicroBatchBudget(rows=4, tokens=10)) == [[2], [0, 1], [3]]
    assert pack_rows([5, 3, 9, 2, 7], MicroBatchBudget(rows=2)) == [[0, 1], [2, 3], [4]]
    assert pack_rows([], MicroBatchBudget(rows=2, tokens=10)) == []
    # prompt_values' packing under optim.shared_prefix: longest first all the same (rows of no token order)
    assert pack_rows([5, 3, 9, 2], MicroBatchBudget(rows=4, tokens=10, shared_prefix=True)) == [[2], [0, 1], [3]]


def test_shared_packing_by_hand():
    """Rows of 100 tokens sharing 80 with the one before: P + n (100 - P) = 80 + 20n <= 200 holds n = 6 rows, where
    2 rows (2 x 100) would fill the budget without sharing; a 31-token prefix is not shared."""
    budget = MicroBatchBudget(rows=1, tokens=200, shared_prefix=True)
    shared_80 = [[1] * 80 + [2 + i] * 20 for i in range(8)]
    packed = pack_shared_rows(shared_80, budget)
    assert [group for group, _ in packed] == [[0, 1, 2, 3, 4, 5], [6, 7]]
    assert [micro_batch.slots() for _, micro_batch in packed] == [200, 120]          # 80 + 6 x 20, 80 + 2 x 20
    shared_31 = [[1] * 31 + [2 + i] * 69 for i in range(4)]
    assert [(group, micro_batch.groups) for group, micro_batch in pack_shared_rows(shared_31, budget)] == [
        ([0, 1], []), ([2, 3], [])]                                                   # plain passes, 2 x 100


def rows_the_estimate_packs_over_the_budget(vocab: int) -> list[list[int]]:
    """Three rows of 200 tokens in token order: the first two share 150, all three 40. The packer's estimate, one
    group of all three, is 40 + 3 x 160 = 520 slots; the forward groups the first two (150 x 1 skipped beats 40 x 2)
    and runs the third alone (its prefix 199): 2 x 199 + 3 x 50 = 548."""
    g = torch.Generator().manual_seed(3)

    def ids(n):
        return torch.randint(1, vocab, (n,), generator=g).tolist()

    common, first = ids(40), ids(110)
    rows = [common + first + ids(50), common + first + ids(50), common + ids(160)]
    return sorted(rows)


def test_shared_packing_never_computes_more_slots_than_the_budget():
    tokens = rows_the_estimate_packs_over_the_budget(VOCAB)
    packed = pack_shared_rows(tokens, MicroBatchBudget(rows=1, tokens=530, shared_prefix=True))
    assert all(micro_batch.slots() <= 530 for _, micro_batch in packed)
    assert sorted(row for group, _ in packed for row in group) == [0, 1, 2]


@given(st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=40), max_size=24), st.integers(1, 300))
def test_shared_packing_keeps_every_row_once_within_the_budget(rows, tokens):
    rows = sorted(rows)
    packed = pack_shared_rows(rows, MicroBatchBudget(rows=1, tokens=tokens, shared_prefix=True))
    assert sorted(i for group, _ in packed for i in group) == list(range(len(rows)))
    for group, micro_batch in packed:
        assert micro_batch.slots() <= tokens or len(group) == 1
        assert micro_batch.lengths == [len(rows[i]) for i in group]


def test_scoring_that_shares_prefixes_stays_within_the_token_budget(policy):
    """The forward's own slots (the body's input ids, both passes of a micro-batch) never pass the budget, and the
    scores are the plain forward's (the rows of `rows_the_estimate_packs_over_the_budget`: estimated at 520 of a
    530 budget, one micro-batch computed 548 before the packer planned its grouping)."""
    from horizonrl.learner import scoring
    from horizonrl.learner.lora import lm_body
    from horizonrl.learner.shared_prefix import NetworkSharing, prefix_sharing

    tokens = rows_the_estimate_packs_over_the_budget(VOCAB)
    data = Rows(torch.tensor(tokens), torch.ones(3, 200, dtype=torch.long), torch.ones(3, 200, dtype=torch.long))
    expected = score(data, MicroBatchBudget(3), actor=policy).logp_old
    slots: list[int] = []                         # per micro-batch, the input ids of every pass of the body
    body = lm_body(policy)
    hook = body.register_forward_pre_hook(lambda _, args, kwargs: slots.__setitem__(-1, slots[-1] +
                                                                                     kwargs["input_ids"].numel()),
                                          with_kwargs=True)
    real = scoring.token_logprobs

    def counted(*args, **kwargs):
        slots.append(0)
        return real(*args, **kwargs)

    sharing = prefix_sharing(body, 32)
    sharing.probe_gap = 0.0      # the start-up probe's extra plain pass: test_shared_prefix.py
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(scoring, "token_logprobs", counted)
            slots.clear()
            actual = score(data, MicroBatchBudget(1, 530, shared_prefix=True), actor=policy,
                           sharing=NetworkSharing(actor=sharing)).logp_old
    finally:
        hook.remove()
    assert slots and max(slots) <= 530, slots
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)


@given(st.lists(st.integers(1, 50), max_size=30), st.integers(1, 120))
def test_token_packing_keeps_every_row_once_within_the_budget(lengths, tokens):
    groups = pack_rows(lengths, MicroBatchBudget(rows=1, tokens=tokens))
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:
        assert len(group) * max(lengths[i] for i in group) <= tokens or len(group) == 1


def test_budget_halves_tokens_or_else_rows():
    assert MicroBatchBudget(8, 1000).halved() == MicroBatchBudget(8, 500)
    assert MicroBatchBudget(8).halved() == MicroBatchBudget(4)
    assert MicroBatchBudget(1).halved() == MicroBatchBudget(1)


@pytest.mark.parametrize(("budget", "device", "expected"), [
    ("auto", "cpu", MicroBatchBudget(4)), ("null", "cuda", MicroBatchBudget(4)),
    ("512", "cuda", MicroBatchBudget(4, 512)),
    ("auto", "cuda", MicroBatchBudget(4, "planned")),
])
def test_a_run_resolves_the_auto_token_budget_on_cuda_only(monkeypatch, budget, device, expected):
    """On CUDA the planner's largest budget for this GPU's memory (a fake 40 GiB one here); on a CPU none."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=40 * GIB))
    cfg = load_config(TOY, ["optim.micro_batch_size=4", f"optim.max_tokens_per_micro_batch={budget}",
                            "optim.shared_prefix=false"])
    if expected.tokens == "planned":
        expected = MicroBatchBudget(4, auto_token_budget(cfg, 1, 40 * GIB))
        assert expected.tokens >= 256
    assert micro_batch_budget(cfg, torch.device(device), gpus=1) == expected


@pytest.fixture(scope="module")
def policy():
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


@pytest.fixture(scope="module")
def data(policy):
    """Right-padded rows of LENGTHS tokens, the first quarter of each a prompt, scored by `policy`."""
    generator = torch.Generator().manual_seed(0)
    width = max(LENGTHS)
    input_ids = torch.randint(VOCAB, (len(LENGTHS), width), generator=generator)
    positions = torch.arange(width)
    lengths = torch.tensor(LENGTHS)[:, None]
    attention_mask = (positions < lengths).long()
    loss_mask = attention_mask * (positions >= lengths // 4).long()
    rows = Rows(input_ids * attention_mask, attention_mask, loss_mask)
    rows = dataclasses.replace(rows, **score(rows, MicroBatchBudget(len(LENGTHS)), actor=policy).given())
    return dataclasses.replace(
        rows, logp_ref=rows.logp_old + 0.1 * torch.randn(loss_mask.shape, generator=generator) * loss_mask,
        advantages=torch.randn(loss_mask.shape, generator=generator) * loss_mask)


def step(policy, data, budget, loss_agg, wrap=lambda loss_fn: loss_fn):
    """One SGD step (lr 1, gradient norm clipped to 1) of the PPO actor loss, entropy and KL terms on, on
    all rows: (new parameters, stats)."""
    actor = copy.deepcopy(policy)
    optimizer = torch.optim.SGD(actor.parameters(), lr=1.0)
    loss_fn = wrap(actor_loss_fn(actor, 0.2, 0.2, 3.0, 0.01, loss_agg, 1.0, kl_loss_coef=0.1))
    stats = Stats()
    rows = list(range(len(LENGTHS)))
    optimizer_step(UpdateStep(optimizer, loss_fn, 1.0, stats), data, rows, budget, float(data.loss_mask.sum()),
                   float(len(rows)))
    return dict(actor.named_parameters()), stats


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_gradient_accumulation_gives_the_full_mini_batch_update_for_any_budget(policy, data, loss_agg):
    expected, expected_stats = step(policy, data, MicroBatchBudget(len(LENGTHS)), loss_agg)
    for budget in (MicroBatchBudget(3), MicroBatchBudget(1, 256), MicroBatchBudget(1, 1024)):
        actual, stats = step(policy, data, budget, loss_agg)
        for name, param in expected.items():
            torch.testing.assert_close(actual[name], param, atol=1e-6, rtol=0, msg=f"{budget} {name}")
        packing = ("padding_share",)          # the one statistic of the packing itself
        assert {k: v for k, v in stats.means("").items() if k not in packing} == pytest.approx(
            {k: v for k, v in expected_stats.means("").items() if k not in packing}, rel=1e-5)


def test_scores_do_not_depend_on_the_packing(policy, data):
    critic = ValueModel.from_policy(policy)
    torch.nn.init.normal_(critic.value_head.weight)
    one_pass = MicroBatchBudget(len(LENGTHS))
    expected = score(data, one_pass, 0.9, actor=policy, reference=policy, critic=critic)
    actual = score(data, MicroBatchBudget(1, 400), 0.9, actor=policy, reference=policy, critic=critic)
    assert actual.given().keys() == expected.given().keys() == {"logp_old", "entropy", "logp_ref", "values_old"}
    for key, value in expected.given().items():
        torch.testing.assert_close(actual.given()[key], value, atol=1e-5, rtol=0, msg=key)
    prompts = [row[:n].tolist() for row, n in zip(data.input_ids, LENGTHS)]
    torch.testing.assert_close(prompt_values(critic, prompts, 0, MicroBatchBudget(1, 400), "cpu"),
                               prompt_values(critic, prompts, 0, one_pass, "cpu"), atol=1e-5, rtol=0)


CUDA_OUT_OF_MEMORY = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 5 GiB")


def out_of_memory_above(tokens: int, error=CUDA_OUT_OF_MEMORY):
    """Fault injection: a loss function that runs out of memory on micro-batches of more than `tokens`
    (rows x width) tokens."""
    def wrap(loss_fn):
        def flaky(mb, num_tokens, num_seqs, micro_batch=None):
            if mb.input_ids.numel() > tokens:
                raise error
            return loss_fn(mb, num_tokens, num_seqs, micro_batch)
        return flaky
    return wrap


@pytest.mark.parametrize(("budget", "share"), [
    (MicroBatchBudget(len(LENGTHS)), 1 - 1_029 / 3_000),     # one micro-batch 10 rows x 300 wide for 1,029 tokens
    # longest first while rows x longest <= 1,024: [300, 230, 150] (3 x 300 = 900 computed for 680 tokens) and the
    # other seven (7 x 120 = 840 for 349)
    (MicroBatchBudget(1, 1_024), 1 - 1_029 / 1_740),
])
def test_the_micro_batches_padding_share_is_reported(policy, data, budget, share):
    _, stats = step(policy, data, budget, "token-mean")
    assert stats.means("")["padding_share"] == pytest.approx(share)


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory."),
                                   RuntimeError("DefaultCPUAllocator: can't allocate memory: out of memory")])
def test_out_of_memory_retries_the_step_with_half_the_budget(policy, data, error):
    expected, expected_stats = step(policy, data, MicroBatchBudget(len(LENGTHS)), "token-mean")
    actual, stats = step(policy, data, MicroBatchBudget(1, 1024), "token-mean", out_of_memory_above(600, error))
    for name, param in expected.items():
        torch.testing.assert_close(actual[name], param, atol=1e-6, rtol=0, msg=name)
    means = stats.means("train/actor/")
    assert means["train/actor/oom_retries"] == 1
    assert means["train/actor/skipped_updates"] == 0
    assert means["train/actor/entropy"] == pytest.approx(expected_stats.means("train/actor/")["train/actor/entropy"])


def test_out_of_memory_again_after_halving_is_an_error_naming_the_budget(policy, data):
    with pytest.raises(RuntimeError, match=r"MicroBatchBudget\(rows=1, tokens=512, shared_prefix=False, window=None\)"):
        step(policy, data, MicroBatchBudget(1, 1024), "token-mean", out_of_memory_above(300))


def test_other_runtime_errors_are_not_retried(policy, data):
    with pytest.raises(RuntimeError, match="shape mismatch"):
        step(policy, data, MicroBatchBudget(1, 1024), "token-mean",
             out_of_memory_above(0, RuntimeError("shape mismatch")))


def test_a_halved_budget_holds_for_the_later_steps(policy, data):
    actor = copy.deepcopy(policy)
    loss_fn = out_of_memory_above(512)(actor_loss_fn(actor, 0.2, 0.2, 3.0, 0.0, "token-mean", 1.0))
    stats = Stats()
    minibatch_updates(data, len(LENGTHS), MicroBatchBudget(1, 1024), 2, torch.Generator().manual_seed(0),
                      [UpdateStep(torch.optim.SGD(actor.parameters(), lr=0.1), loss_fn, 1.0, stats)])
    assert stats.means("")["oom_retries"] == 1                # 2 steps, only the first one retried


def test_a_nan_loss_skips_the_update_and_counts_it(policy, data):
    nan_data = dataclasses.replace(data, advantages=data.advantages.clone())
    nan_data.advantages[1, -1] = float("nan")              # a padded position: NaN * 0 is still NaN
    actual, stats = step(policy, nan_data, MicroBatchBudget(len(LENGTHS)), "token-mean")
    for name, param in policy.named_parameters():
        assert torch.equal(actual[name], param), name
    assert stats.means("")["skipped_updates"] == 1
    assert "loss" not in stats.sums
