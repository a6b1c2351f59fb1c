"""Networks that score the rows only when a term reads their scores (train/phases.needed_scores).

An update of one optimizer step needs no scored logp_old: its own forward, detached, is the old policy
(learner/update.actor_loss_fn). At that step rho = 1, so the gradient of the PPO loss with TIS weights
w = min(exp(logp_old - logp_engine), cap) is that of the plain surrogate

    L = -sum_t w_t A_t logp_t / n_tokens        (no clipping at rho = 1; entropy_coef 0 here)

which the test differentiates through the model's own logits, without the chunked log-probs.
The reference and the actor are counted in forward passes of their bodies, not read from flags.
"""

import copy
import dataclasses
from types import SimpleNamespace

import pytest
import torch

from horizonrl.config import MicroBatchBudget, TrainConfig
from horizonrl.learner.models import load_policy
from horizonrl.learner.shared_prefix import UNSHARED
from horizonrl.learner.scoring import score
from horizonrl.learner.update import Stats, UpdateStep, actor_loss_fn, minibatch_updates
from horizonrl.records import Episode, Turn
from horizonrl.samples.tensors import Rows
from horizonrl.train import phases

LENGTHS = [23, 9, 17, 30, 12, 26]       # rows of prompt + response, responses the last 8 tokens
SAMPLED, TIS_CAP = 8, 1.5


@pytest.fixture(scope="module")
def tiny():
    return load_policy("builtin:babyai-tiny", torch.device("cpu"))


@pytest.fixture(scope="module")
def rows(tiny):
    """Right-padded random rows with advantages, and engine log-probs spread around the learner's so
    that the TIS cap binds on some tokens."""
    _, policy = tiny
    generator = torch.Generator().manual_seed(0)
    lengths = torch.tensor(LENGTHS)[:, None]
    positions = torch.arange(max(LENGTHS))
    attention_mask = (positions < lengths).long()
    loss_mask = (attention_mask * (positions >= lengths - SAMPLED)).float()
    data = Rows(torch.randint(policy.config.vocab_size, attention_mask.shape, generator=generator) * attention_mask,
                attention_mask, loss_mask)
    logp = score(data, MicroBatchBudget(len(LENGTHS)), actor=policy).logp_old
    return dataclasses.replace(
        data, logp_engine=logp + 0.5 * torch.randn(loss_mask.shape, generator=generator) * loss_mask,
        logp_ref=logp - 0.2 * loss_mask, advantages=torch.randn(loss_mask.shape, generator=generator) * loss_mask)


def one_step(policy, data: Rows, budget: MicroBatchBudget) -> tuple[dict, dict]:
    """(gradient of every parameter, statistics) of one minibatch_updates step of the actor loss on all
    rows: an SGD step of lr 1 with the gradient norm unclipped, so the gradient is old - new."""
    actor = copy.deepcopy(policy)
    before = {name: p.detach().clone() for name, p in actor.named_parameters()}
    loss_fn = actor_loss_fn(actor, 0.2, 0.2, 3.0, 0.0, "token-mean", 1.0, tis_cap=TIS_CAP)
    stats = Stats()
    minibatch_updates(data, len(data), budget, 1, torch.Generator().manual_seed(0),
                      [UpdateStep(torch.optim.SGD(actor.parameters(), lr=1.0), loss_fn, 1e9, stats)])
    return {name: before[name] - p.detach() for name, p in actor.named_parameters()}, stats.means("train/actor/")


def surrogate_gradient(policy, data: Rows) -> dict:
    """d/dtheta of -sum_t w_t A_t logp_t / n, logp from the model's full logits."""
    actor = copy.deepcopy(policy)
    ids, mask = data.input_ids, data.loss_mask[:, 1:]
    log_probs = actor(input_ids=ids, attention_mask=data.attention_mask).logits[:, :-1].log_softmax(dim=-1)
    logp = log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1)
    weights = torch.exp(logp.detach() - data.logp_engine[:, 1:]).clamp(max=TIS_CAP)
    (-(weights * data.advantages[:, 1:] * logp * mask).sum() / mask.sum()).backward()
    return {name: p.grad for name, p in actor.named_parameters()}


@pytest.mark.parametrize("budget", [MicroBatchBudget(len(LENGTHS)), MicroBatchBudget(2), MicroBatchBudget(1, 60)])
def test_one_step_without_old_log_probs_is_the_step_with_them(tiny, rows, budget):
    policy = tiny[1]
    scored = dataclasses.replace(rows, logp_old=score(rows, MicroBatchBudget(len(LENGTHS)), actor=policy).logp_old)
    expected_grads, expected_stats = one_step(policy, scored, budget)
    grads, stats = one_step(policy, rows, budget)
    independent = surrogate_gradient(policy, rows)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], atol=1e-6, rtol=0, msg=name)
        torch.testing.assert_close(grad, independent[name], atol=1e-6, rtol=0, msg=name)
    assert stats.keys() == expected_stats.keys()
    assert stats == pytest.approx(expected_stats, rel=1e-5, abs=1e-6)
    for key in ("rollout/logprob_abs_diff", "rollout/tis_weight_mean", "rollout/tis_clipped_frac", "train/kl_ref"):
        assert key in stats                               # measured in the update, under their own names
    assert 0 < stats["rollout/tis_clipped_frac"] < 1 and stats["train/actor/approx_kl"] == 0.0


def test_the_sampler_statistics_are_those_of_the_scored_log_probs(tiny, rows):
    """|logp_old - logp_engine| and min(exp(logp_old - logp_engine), cap) averaged over sampled tokens."""
    logp_old = score(rows, MicroBatchBudget(len(LENGTHS)), actor=tiny[1]).logp_old
    mask = rows.loss_mask.bool()
    gap = (logp_old - rows.logp_engine)[mask]
    _, stats = one_step(tiny[1], rows, MicroBatchBudget(len(LENGTHS)))
    assert stats["rollout/logprob_abs_diff"] == pytest.approx(float(gap.abs().mean()), rel=1e-5)
    assert stats["rollout/tis_weight_mean"] == pytest.approx(float(gap.exp().clamp(max=TIS_CAP).mean()), rel=1e-5)
    assert stats["train/kl_ref"] == pytest.approx(float(torch.tensor(-0.2).exp() - 1 + 0.2), rel=1e-4)


def episodes(n: int) -> list[Episode]:
    """n one-turn episodes in groups of two: prompts of 5 + k tokens, responses of 4."""
    return [Episode(str(k), "t", k, group_id=str(k // 2), outcome_reward=float(k % 2),
                    turns=[Turn(list(range(3, 8 + k)), [9, 10, 11, 12], [-1.0] * 4, terminated=True)])
            for k in range(n)]


ROWS, MICRO = 6, 4                      # 6 rows in micro-batches of 4: two forward passes a network scores
GROUP = {"algorithm": "grpo", "optim": {"mini_batch_size": ROWS, "micro_batch_size": MICRO}}
PPO = {"algorithm": "ppo", "rollout": {"n_env": 2}, "ppo": {"e_len": 3, "kl_coef": 0.0},
       "optim": {"mini_batch_size": ROWS, "micro_batch_size": MICRO}}


def with_(base: dict, **changes) -> dict:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        section, name = key.split("__")
        out.setdefault(section, {})[name] = value
    return out


UNSYNCED = SimpleNamespace(weights_version=0)   # an engine before any sync


@pytest.mark.parametrize("config, actor_passes, reference_passes", [
    (GROUP, 0, 0),                                               # one step, no KL: neither
    (with_(GROUP, actor__kl_loss_coef=0.1), 0, 2),               # beta: the reference alone
    (with_(GROUP, optim__epochs=2), 2, 0),                       # two epochs: logp_old must be the old policy's
    (with_(GROUP, optim__mini_batch_size=3), 2, 0),              # two mini-batches: likewise
    (with_(GROUP, ppo__kl_coef=0.1), 0, 0),                      # ppo's KL in the reward: not a group algorithm's
    (PPO, 0, 0),                                                 # ppo, no KL term
    (with_(PPO, ppo__kl_coef=0.001), 2, 2),                      # the KL in the reward reads both
    (with_(PPO, actor__kl_loss_coef=0.1), 0, 2),
])
def test_a_network_scores_the_rows_only_when_a_term_reads_them(tiny, tmp_path, config, actor_passes,
                                                               reference_passes):
    tokenizer, policy = tiny
    actor, reference = copy.deepcopy(policy), copy.deepcopy(policy)
    passes = {"actor": 0, "reference": 0}
    for name, model in (("actor", actor), ("reference", reference)):
        model.model.register_forward_pre_hook(lambda *_, name=name: passes.__setitem__(name, passes[name] + 1))
    cfg = TrainConfig(**config)
    ctx = SimpleNamespace(cfg=cfg, actor=actor, reference=reference, pad_id=0, device=torch.device("cpu"),
                          tokenizer=tokenizer, run_dir=tmp_path, ranks=phases.LOCAL, engine=UNSYNCED,
                          micro_batch_budget=MicroBatchBudget(cfg.optim.micro_batch_size), sharing=UNSHARED)
    batch = phases.score(ctx, episodes(ROWS), critic=None)
    assert passes == {"actor": actor_passes, "reference": reference_passes}
    scored = (batch.rows.logp_old is not None, batch.rows.logp_ref is not None)
    assert scored == (actor_passes > 0, reference_passes > 0)


def test_the_critic_warmup_batches_are_scored_by_no_policy_without_a_kl_in_the_reward(tiny, tmp_path):
    tokenizer, policy = tiny
    cfg = TrainConfig(**with_(PPO, optim__epochs=2))
    ctx = SimpleNamespace(cfg=cfg, actor=policy, reference=policy, pad_id=0, device=torch.device("cpu"),
                          tokenizer=tokenizer, run_dir=tmp_path, ranks=phases.LOCAL, engine=UNSYNCED,
                          micro_batch_budget=MicroBatchBudget(cfg.optim.micro_batch_size), sharing=UNSHARED)
    batch = phases.score(ctx, episodes(ROWS), critic=None, updates_actor=False)
    assert batch.rows.logp_old is None and batch.rows.logp_ref is None
