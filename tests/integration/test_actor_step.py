"""One optimizer step of the actor loss (`actor_loss_fn` through `minibatch_updates`) moves the policy
the way the signs of the advantages and of the entropy coefficient say, on rows of real prompts and
responses sampled from the tiny model.

    loss = -mean_t(ratio_t * A_t) - entropy_coef * mean_t(H_t)        (first step: ratio = 1, no clip)

so a positive A on every sampled token raises sum_t log pi(token_t), a negative one lowers it; with A = 0
only the entropy term acts, and entropy_coef > 0 raises the mean entropy, < 0 lowers it.
"""

import copy

import pytest
import torch

from horizonrl.agents.agent import Agent
from horizonrl.config import MicroBatchBudget
from horizonrl.envs.river import River
from horizonrl.learner.models import pad_token_id
from horizonrl.learner.scoring import score
from horizonrl.learner.update import Stats, actor_loss_fn, minibatch_updates
from horizonrl.records import Episode, Turn
from horizonrl.samples.per_turn import per_turn
from horizonrl.samples.tensors import row_tensors

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
    data = row_tensors(per_turn(episodes), pad_token_id(tokenizer), torch.device("cpu"))
    assert data["loss_mask"].sum() >= 6
    return data


def step(model, data, advantage: float, entropy_coef: float) -> tuple[dict, dict]:
    """Scores before and after one AdamW step of the actor loss on all rows, with A = `advantage` on
    every sampled token."""
    actor = copy.deepcopy(model)
    budget = MicroBatchBudget(len(data["input_ids"]))
    data = dict(data)
    before = score(data, budget, actor=actor)
    data.update(logp_old=before["logp_old"], advantages=advantage * data["loss_mask"])
    optimizer = torch.optim.AdamW(actor.parameters(), lr=LR, weight_decay=0.0)
    loss_fn = actor_loss_fn(actor, clip_low=0.2, clip_high=0.2, dual_clip=None, entropy_coef=entropy_coef,
                            loss_agg="token-mean", temperature=1.0)
    stats = Stats()
    minibatch_updates(data, len(data["input_ids"]), budget, 1, torch.Generator().manual_seed(0),
                      [(optimizer, loss_fn, 1.0, stats)])
    assert stats.sums["skipped_updates"] == 0 and stats.counts["loss"] == 1        # one real step
    return before, score(data, budget, actor=actor)


def total(scores: dict, key: str, mask) -> float:
    return float((scores[key] * mask).sum())


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_the_sign_of_the_advantage_is_the_direction_of_the_sampled_tokens_log_probs(river_tiny, rows, advantage):
    before, after = step(river_tiny[1], rows, advantage, entropy_coef=0.0)
    change = total(after, "logp_old", rows["loss_mask"]) - total(before, "logp_old", rows["loss_mask"])
    assert change * advantage > 0.05, change


@pytest.mark.parametrize("entropy_coef", [1.0, -1.0])
def test_the_entropy_bonus_raises_the_entropy_and_a_negative_coefficient_lowers_it(river_tiny, rows, entropy_coef):
    before, after = step(river_tiny[1], rows, 0.0, entropy_coef)
    n = float(rows["loss_mask"].sum())
    change = (total(after, "entropy", rows["loss_mask"]) - total(before, "entropy", rows["loss_mask"])) / n
    assert change * entropy_coef > 1e-3, change
