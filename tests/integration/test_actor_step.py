"""One optimizer step of the actor loss (`actor_loss_fn` through `minibatch_updates`) moves the policy
the way the signs of the advantages and of the entropy coefficient say, on rows of real prompts and
responses sampled from the tiny model.

    loss = -mean_t(ratio_t * A_t) - entropy_coef * mean_t(H_t)        (first step: ratio = 1, no clip)

so a positive A on every sampled token raises sum_t log pi(token_t), a negative one lowers it; with A = 0
only the entropy term acts, and entropy_coef > 0 raises the mean entropy, < 0 lowers it.
"""

import copy
import dataclasses

import pytest
import torch

from horizonrl.agents.agent import Agent
from horizonrl.config import MicroBatchBudget
from horizonrl.envs.river import River
from horizonrl.learner.models import pad_token_id
from horizonrl.learner.scoring import Scores, score
from horizonrl.learner.update import Stats, UpdateStep, actor_loss_fn, minibatch_updates
from horizonrl.records import Episode, Turn
from horizonrl.samples.per_turn import per_turn
from horizonrl.samples.tensors import Rows

torch.set_num_threads(1)

LR = 1e-3


@pytest.fixture(scope="module")
def rows(river_tiny):
    """Three one-turn rows: river prompts of three seeds, responses the tiny model sampled for them."""
    tokenizer, model = river_tiny
    env, agent = River(), Agent(tokenizer)
    episodes = []
    with torch.random.fork_rng():
        torch.manual_seed(0)
        for seed in range(3):
            prompt = agent.prompt_ids(env, [], env.reset(seed)[0])
            ids = torch.tensor([prompt])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=6,
                                 pad_token_id=pad_token_id(tokenizer))
            response = out[0, len(prompt):].tolist()
            episodes.append(Episode(str(seed), "river", seed, turns=[Turn(prompt, response, None, terminated=True)]))
    data = Rows.of(per_turn(episodes), pad_token_id(tokenizer), torch.device("cpu"))
    assert data.loss_mask.sum() >= 6
    return data


def step(model, data, advantage: float, entropy_coef: float) -> tuple[Scores, Scores]:
    """Scores before and after one AdamW step of the actor loss on all rows, with A = `advantage` on
    every sampled token."""
    actor = copy.deepcopy(model)
    budget = MicroBatchBudget(len(data))
    before = score(data, budget, actor=actor)
    data = dataclasses.replace(data, logp_old=before.logp_old, advantages=advantage * data.loss_mask)
    optimizer = torch.optim.AdamW(actor.parameters(), lr=LR, weight_decay=0.0)
    loss_fn = actor_loss_fn(actor, clip_low=0.2, clip_high=0.2, dual_clip=None, entropy_coef=entropy_coef,
                            loss_agg="token-mean", temperature=1.0)
    stats = Stats()
    minibatch_updates(data, len(data), budget, 1, torch.Generator().manual_seed(0),
                      [UpdateStep(optimizer, loss_fn, 1.0, stats)])
    assert stats.sums["skipped_updates"] == 0 and stats.counts["loss"] == 1        # one real step
    return before, score(data, budget, actor=actor)


def total(scores: Scores, field: str, mask) -> float:
    return float((getattr(scores, field) * mask).sum())


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_the_sign_of_the_advantage_is_the_direction_of_the_sampled_tokens_log_probs(river_tiny, rows, advantage):
    before, after = step(river_tiny[1], rows, advantage, entropy_coef=0.0)
    change = total(after, "logp_old", rows.loss_mask) - total(before, "logp_old", rows.loss_mask)
    assert change * advantage > 0.05, change


@pytest.mark.parametrize("entropy_coef", [1.0, -1.0])
def test_the_entropy_bonus_raises_the_entropy_and_a_negative_coefficient_lowers_it(river_tiny, rows, entropy_coef):
    before, after = step(river_tiny[1], rows, 0.0, entropy_coef)
    n = float(rows.loss_mask.sum())
    change = (total(after, "entropy", rows.loss_mask) - total(before, "entropy", rows.loss_mask)) / n
    assert change * entropy_coef > 1e-3, change


def epochs_of_updates(model, data, epochs: int, lr: float) -> tuple[torch.nn.Module, Stats]:
    """A copy of `model` after `epochs` epochs of one AdamW step each on all rows of `data`, and their statistics."""
    actor = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(actor.parameters(), lr=lr, weight_decay=0.0)
    loss_fn = actor_loss_fn(actor, clip_low=0.2, clip_high=0.2, dual_clip=None, entropy_coef=0.0,
                            loss_agg="token-mean", temperature=1.0)
    stats = Stats()
    minibatch_updates(data, len(data), MicroBatchBudget(len(data)), epochs, torch.Generator().manual_seed(0),
                      [UpdateStep(optimizer, loss_fn, 1.0, stats)])
    return actor, stats


def test_the_second_epoch_clips_against_the_policy_before_the_update(river_tiny, rows):
    """The ratio of a later epoch is pi_1 / pi_old, pi_old the policy scored before the update (`logp_old`), not
    the current parameters: with A = +1 on every token, epoch 1 (ratio 1) has surrogate -1 per token and epoch 2
    -mean_t min(r_t, clip(r_t, 0.8, 1.2)), r_t = exp(logp_1 - logp_old), pi_1 scored here from a copy stepped once.
    A logp_old copied from the current parameters (the forward's own, detached) gives r = 1 again: -1, no clip."""
    model, mask = river_tiny[1], rows.loss_mask
    budget, n = MicroBatchBudget(len(rows)), float(mask.sum())
    data = dataclasses.replace(rows, advantages=mask.clone())
    data = dataclasses.replace(data, logp_old=score(data, budget, actor=model).logp_old)
    stepped_once, _ = epochs_of_updates(model, data, 1, lr=1e-3)
    ratio = torch.exp(score(data, budget, actor=stepped_once).logp_old - data.logp_old)
    expected = float(-(torch.minimum(ratio, ratio.clamp(0.8, 1.2)) * mask).sum() / n)
    clipped = float(((ratio > 1.2) * mask).sum() / n)
    assert clipped > 0.1 and expected > -1.2, (clipped, expected)   # some tokens clip, not all (10 of 13 here)

    _, stats = epochs_of_updates(model, data, 2, lr=1e-3)
    second_epoch = 2 * stats.sums["pg_loss"] / stats.counts["pg_loss"] + 1          # the mean over both, less epoch 1
    assert abs(second_epoch - expected) < 1e-4, (second_epoch, expected)
    assert abs(2 * stats.sums["clipfrac"] / stats.counts["clipfrac"] - clipped) < 1e-6

    _, wrong = epochs_of_updates(model, dataclasses.replace(data, logp_old=None), 2, lr=1e-3)
    assert wrong.sums["clipfrac"] == 0 and abs(wrong.sums["pg_loss"] / wrong.counts["pg_loss"] + 1) < 1e-6
