"""group_advantages_to_tokens (train/batch.py): each episode's group advantage on exactly the sampled
tokens of that episode's rows, its outcome reward as the return there, and 0 everywhere else; and
gigpo_advantages_to_tokens: each turn's own advantage on that turn's tokens, inside merged rows too;
rae_advantages_to_tokens: each episode's return less its seat's moving baseline.

The batch is built as `train.batch.prepare` builds it, without networks. Expected tensors are written
out by hand: the loss-mask pattern of every row as a literal, the advantages worked out in comments.
"""

import math

import pytest
import torch

from horizonrl.records import Episode, Turn
from horizonrl.samples.merge import merge_turns
from horizonrl.samples.per_turn import per_turn
from horizonrl.samples.tensors import Rows, TurnIndex
from horizonrl.config import GiGPOConfig
from horizonrl.train.batch import PPOBatch
from horizonrl.algos.rae import RoleBaselines
from horizonrl.train.group import gigpo_advantages_to_tokens, group_advantages_to_tokens, rae_advantages_to_tokens

torch.set_num_threads(1)

PAD = 0
EPS = 1e-6


def turn(prompt, response, terminated=False, truncated=False):
    return Turn(prompt, response, None, 0.0, terminated, truncated)


def episodes() -> list[Episode]:
    """Five episodes of two interleaved groups, of 2, 1, 3, 1 and 2 turns (rows do not line up with
    episodes), outcome rewards A: 6, 2, 1 and B: 1.0, 0.5."""
    return [
        Episode("e0", "t", 0, "A", [turn([1, 2], [3, 4]), turn([1, 2, 3, 4, 5], [6], terminated=True)],
                outcome_reward=6.0),
        Episode("e1", "t", 1, "B", [turn([7], [8, 9, 10], terminated=True)], outcome_reward=1.0),
        Episode("e2", "t", 0, "A", [turn([11, 12, 13], [14]), turn([15], [16, 17]),
                                    turn([15, 16, 17, 18], [19, 20, 21], terminated=True)], outcome_reward=2.0),
        Episode("e3", "t", 1, "B", [turn([22, 23], [24, 25], terminated=True)], outcome_reward=0.5),
        Episode("e4", "t", 0, "A", [turn([26], [27]), turn([26, 27, 28], [29, 30], truncated=True)],
                bootstrap_prompt_ids=[26, 27, 28, 29, 30, 31], outcome_reward=1.0),
    ]


def as_batch(eps: list[Episode], samples) -> PPOBatch:
    """What `prepare` builds, scores left out."""
    data = Rows.of(samples, PAD, torch.device("cpu"))
    return PPOBatch(eps, samples, TurnIndex.of(samples, torch.device("cpu")), data, torch.zeros(0))


def per_turn_rows(a0, a1, a2, a3, a4) -> torch.Tensor:
    """[9, 7]: one row per turn (per_turn), episode k's value on its response positions."""
    return torch.tensor([
        [0, 0, a0, a0, 0, 0, 0],          # e0 turn 0: prompt 2, response 2
        [0, 0, 0, 0, 0, a0, 0],           # e0 turn 1: prompt 5, response 1
        [0, a1, a1, a1, 0, 0, 0],         # e1:        prompt 1, response 3
        [0, 0, 0, a2, 0, 0, 0],           # e2 turn 0: prompt 3, response 1
        [0, a2, a2, 0, 0, 0, 0],          # e2 turn 1: prompt 1, response 2
        [0, 0, 0, 0, a2, a2, a2],         # e2 turn 2: prompt 4, response 3
        [0, 0, a3, a3, 0, 0, 0],          # e3:        prompt 2, response 2
        [0, a4, 0, 0, 0, 0, 0],           # e4 turn 0: prompt 1, response 1
        [0, 0, 0, a4, a4, 0, 0],          # e4 turn 1: prompt 3, response 2
    ], dtype=torch.float32)


def merged_rows(a0, a1, a2, a3, a4) -> torch.Tensor:
    """[6, 7]: prefix-merged rows; e0 and e4 are one row each, e2 breaks after its first turn."""
    return torch.tensor([
        [0, 0, a0, a0, 0, a0, 0],         # e0: [1 2] 3 4 [5] 6
        [0, a1, a1, a1, 0, 0, 0],         # e1: [7] 8 9 10
        [0, 0, 0, a2, 0, 0, 0],           # e2 turn 0: [11 12 13] 14
        [0, a2, a2, 0, a2, a2, a2],       # e2 turns 1-2: [15] 16 17 [18] 19 20 21
        [0, 0, a3, a3, 0, 0, 0],          # e3: [22 23] 24 25
        [0, a4, 0, a4, a4, 0, 0],         # e4: [26] 27 [28] 29 30
    ], dtype=torch.float32)


# Group A = e0, e2, e4 with rewards 6, 2, 1: mean 3, centred +3, -1, -2,
#   unbiased variance (9 + 1 + 4) / (3 - 1) = 7, std sqrt(7) = 2.6457513.
# Group B = e1, e3 with rewards 1.0, 0.5: mean 0.75, centred +0.25, -0.25,
#   unbiased variance (0.0625 + 0.0625) / 1 = 0.125, std sqrt(0.125) = 0.3535534.
SQRT7, SQRT_EIGHTH = math.sqrt(7), math.sqrt(0.125)
HAND = {
    # (r - mean) / (std + eps): e0 3 / 2.6457513 = 1.1338930, e2 -0.3779643, e4 -0.7559287;
    #                           e1 0.25 / 0.3535534 = 0.7071048 (eps shaves 2e-6), e3 -0.7071048
    "grpo": (3 / (SQRT7 + EPS), 0.25 / (SQRT_EIGHTH + EPS), -1 / (SQRT7 + EPS), -0.25 / (SQRT_EIGHTH + EPS),
             -2 / (SQRT7 + EPS)),
    # r - mean
    "dr_grpo": (3.0, 0.25, -1.0, -0.25, -2.0),
    # r - mean of the others: e0 6 - (2+1)/2 = 4.5, e2 2 - (6+1)/2 = -1.5, e4 1 - (6+2)/2 = -3;
    #                         e1 1 - 0.5 = 0.5, e3 0.5 - 1 = -0.5
    "rloo": (4.5, 0.5, -1.5, -0.5, -3.0),
}
REWARDS = (6.0, 1.0, 2.0, 0.5, 1.0)


def test_the_hand_built_rows_have_the_mask_pattern_written_out_here():
    batch = as_batch(episodes(), per_turn(episodes()))
    assert torch.equal(batch.rows.loss_mask, per_turn_rows(1, 1, 1, 1, 1))
    merged = as_batch(episodes(), merge_turns(episodes(), None, None, None)[0])
    assert torch.equal(merged.rows.loss_mask, merged_rows(1, 1, 1, 1, 1))
    assert len(merged.samples.segments) == 9      # nine turns in six rows


@pytest.mark.parametrize("estimator", sorted(HAND))
def test_each_rows_sampled_tokens_carry_their_episodes_group_advantage_and_nothing_else(estimator):
    batch = as_batch(episodes(), per_turn(episodes()))
    group_advantages_to_tokens(batch, estimator)
    torch.testing.assert_close(batch.rows.advantages, per_turn_rows(*HAND[estimator]), rtol=1e-6, atol=1e-6)
    assert torch.equal(batch.rows.returns, per_turn_rows(*REWARDS))


@pytest.mark.parametrize("estimator", sorted(HAND))
def test_merged_rows_holding_several_turns_get_their_episodes_advantage(estimator):
    """Six rows for nine turns: a mapping by turn (segment) index instead of row would misplace them."""
    batch = as_batch(episodes(), merge_turns(episodes(), None, None, None)[0])
    group_advantages_to_tokens(batch, estimator)
    torch.testing.assert_close(batch.rows.advantages, merged_rows(*HAND[estimator]), rtol=1e-6, atol=1e-6)
    assert torch.equal(batch.rows.returns, merged_rows(*REWARDS))



def stepped_episodes() -> list[Episode]:
    """episodes() with step rewards (summing to each outcome reward) and env states:
    A: e0 rewards 1, 5 in states s, u; e2 rewards 0, 1, 1 in s, t, u; e4 rewards 0, 1 in s, t;
    B: e1 reward 1 in s; e3 reward 0.5 in s."""
    eps = episodes()
    plan = {"e0": ([1, 5], "su"), "e1": ([1], "s"), "e2": ([0, 1, 1], "stu"), "e3": ([0.5], "s"), "e4": ([0, 1], "st")}
    for e in eps:
        rewards, states = plan[e.episode_id]
        for t, reward, state in zip(e.turns, rewards, states):
            t.reward, t.state_key = float(reward), state
    return eps


def test_gigpo_puts_each_turns_own_advantage_on_its_tokens_of_a_merged_row():
    """gamma 0.5, norm none. Step returns: e0 1 + 0.5 * 5 = 3.5, 5; e2 0.5 * (1 + 0.5) = 0.75, 1.5, 1;
    e4 0.5, 1; e1 1; e3 0.5. Anchors: (A, s) 3.5, 0.75, 0.5 mean 19/12 -> 23/12, -10/12, -13/12;
    (A, u) 5, 1 -> +2, -2; (A, t) 1.5, 1 -> +0.25, -0.25; (B, s) 1, 0.5 -> +0.25, -0.25.
    Episodes (r - mean): A 6, 2, 1 -> +3, -1, -2; B 1, 0.5 -> +0.25, -0.25. Turn = episode + step."""
    eps = stepped_episodes()
    batch = as_batch(eps, merge_turns(eps, None, None, None)[0])
    stats = gigpo_advantages_to_tokens(batch, GiGPOConfig(gamma=0.5, step_weight=1.0, norm="none"))
    e0 = (3 + 23 / 12, 3 + 2)
    e1 = 0.25 + 0.25
    e2 = (-1 - 10 / 12, -1 + 0.25, -1 - 2)
    e3 = -0.25 - 0.25
    e4 = (-2 - 13 / 12, -2 - 0.25)
    expected = torch.tensor([
        [0, 0, e0[0], e0[0], 0, e0[1], 0],
        [0, e1, e1, e1, 0, 0, 0],
        [0, 0, 0, e2[0], 0, 0, 0],
        [0, e2[1], e2[1], 0, e2[2], e2[2], e2[2]],
        [0, 0, e3, e3, 0, 0, 0],
        [0, e4[0], 0, e4[1], e4[1], 0, 0],
    ], dtype=torch.float32)
    torch.testing.assert_close(batch.rows.advantages, expected, rtol=1e-6, atol=1e-6)
    assert torch.equal(batch.rows.returns, merged_rows(*REWARDS))
    # anchor sizes of the nine turns: 3, 2 | 2 | 3, 2, 2 | 2 | 3, 2
    assert stats == {"gigpo/anchor_group_size_mean": pytest.approx(21 / 9), "gigpo/anchored_step_frac": 1.0}


def test_gigpo_refuses_turns_without_a_state_key():
    batch = as_batch(episodes(), per_turn(episodes()))
    with pytest.raises(ValueError, match="gigpo needs every turn's state_key"):
        gigpo_advantages_to_tokens(batch, GiGPOConfig())


def seated_episodes() -> list[Episode]:
    """episodes() as games of one task: e0, e2 and e4 played seat 0, e1 and e3 seat 1."""
    eps = episodes()
    for e in eps:
        for t in e.turns:
            t.seat = 0 if e.episode_id in ("e0", "e2", "e4") else 1
    return eps


def test_rae_puts_each_episodes_return_less_its_seats_moved_baseline_on_its_tokens():
    """decay 0.5, baselines from 0. Seat 0 (e0, e2, e4: 6, 2, 1, mean 3): b = 0.5 * 0 + 0.5 * 3 = 1.5, so
    4.5, 0.5, -0.5; seat 1 (e1, e3: 1, 0.5, mean 0.75): b = 0.375, so 0.625, 0.125. A second batch of the same
    returns moves them to 0.5 * 1.5 + 0.5 * 3 = 2.25 and 0.5 * 0.375 + 0.5 * 0.75 = 0.5625."""
    baselines = RoleBaselines(decay=0.5)
    batch = as_batch(seated_episodes(), merge_turns(seated_episodes(), None, None, None)[0])
    stats = rae_advantages_to_tokens(batch, baselines, per_seat=True)
    torch.testing.assert_close(batch.rows.advantages, merged_rows(4.5, 0.625, 0.5, 0.125, -0.5))
    assert torch.equal(batch.rows.returns, merged_rows(*REWARDS))
    assert stats == {"rae/baseline/t/seat0": 1.5, "rae/baseline/t/seat1": 0.375}
    rae_advantages_to_tokens(as_batch(seated_episodes(), per_turn(seated_episodes())), baselines, per_seat=True)
    assert baselines.state_dict() == {"t/seat0": 2.25, "t/seat1": 0.5625}


def test_rae_without_role_conditioning_shares_one_baseline_across_the_seats():
    """per_seat false: the five returns 6, 1, 2, 0.5, 1 (mean 2.1) move one baseline to 1.05."""
    baselines = RoleBaselines(decay=0.5)
    batch = as_batch(seated_episodes(), per_turn(seated_episodes()))
    assert rae_advantages_to_tokens(batch, baselines, per_seat=False) == {"rae/baseline/t": pytest.approx(1.05)}
    torch.testing.assert_close(batch.rows.advantages, per_turn_rows(4.95, -0.05, 0.95, -0.55, -0.05))
