"""Unit tests for horizonrl.algos.gigpo_advantages: golden values worked by hand.

The batch (gamma 0.5):
    task group 0:  ep0 states A, B  rewards 0, 1   -> return 1, step returns 0.5, 1
                   ep1 states A, C, A  rewards 0, 0, 0 -> return 0, step returns 0, 0, 0   (A revisited)
                   ep2 states A, B  rewards 0, 1   -> return 1, step returns 0.5, 1
    task group 1:  ep3 state A  reward 0.5         -> a group of one
    task group 2:  ep4, ep5 state X  reward 2      -> a constant group
Episode advantages, group 0: returns 1, 0, 1, mean 2/3, unbiased std sqrt(((1/3)^2 * 2 + (2/3)^2) / 2)
= 1/sqrt(3), so A = sqrt(3)/3, -2 sqrt(3)/3, sqrt(3)/3; groups 1 and 2 give 0.
Anchor groups: (0, A) = ep0 s0, ep1 s0, ep1 s2, ep2 s0 with G = 0.5, 0, 0, 0.5: mean 1/4, std
sqrt(4 / 16 / 3) = 1/(2 sqrt(3)), so A_step = +-sqrt(3)/2; (0, B) is constant, (0, C), (1, A) are
singletons, (2, X) is constant: 0.
"""

import math

import pytest
import torch

from horizonrl.algos import gigpo_advantages
from horizonrl.algos.gigpo import anchor_group_sizes

torch.set_num_threads(1)

RETURNS = [1.0, 0.0, 1.0, 0.5, 2.0, 2.0]
GROUPS = [0, 0, 0, 1, 2, 2]
STEP_REWARDS = [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.5, 2.0, 2.0]
STEP_EPISODE = [0, 0, 1, 1, 1, 2, 2, 3, 4, 5]
STEP_STATE = ["A", "B", "A", "C", "A", "A", "B", "A", "X", "X"]
R3 = math.sqrt(3)


def advantages(**options):
    return gigpo_advantages(torch.tensor(RETURNS), torch.tensor(GROUPS), torch.tensor(STEP_REWARDS),
                            torch.tensor(STEP_EPISODE), STEP_STATE, gamma=0.5, **options)


def test_std_norm_golden_values():
    up, down = R3 / 3 + R3 / 2, -2 * R3 / 3 - R3 / 2          # 5 sqrt(3)/6, -7 sqrt(3)/6
    expected = [up, R3 / 3, down, -2 * R3 / 3, down, up, R3 / 3, 0.0, 0.0, 0.0]
    torch.testing.assert_close(advantages(eps=0.0), torch.tensor(expected), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(advantages(), torch.tensor(expected), rtol=1e-5, atol=1e-5)   # eps = 1e-6


def test_no_norm_and_step_weight():
    # episode: 1/3, -2/3, 1/3 (x - mean); anchor (0, A): +-1/4, weighted by 0.5
    expected = [1 / 3 + 0.125, 1 / 3, -2 / 3 - 0.125, -2 / 3, -2 / 3 - 0.125, 1 / 3 + 0.125, 1 / 3, 0.0, 0.0, 0.0]
    torch.testing.assert_close(advantages(norm="none", step_weight=0.5), torch.tensor(expected))


def test_step_weight_zero_is_the_episode_advantage_on_every_step():
    expected = [R3 / 3, R3 / 3, -2 * R3 / 3, -2 * R3 / 3, -2 * R3 / 3, R3 / 3, R3 / 3, 0.0, 0.0, 0.0]
    torch.testing.assert_close(advantages(step_weight=0.0, eps=0.0), torch.tensor(expected))


def test_step_returns_are_discounted_to_the_end_of_their_episode_only():
    # one group, two episodes in state S at both steps; rewards (1, 2) and (0, 0): G = 1 + 0.5 * 2 = 2, 2, 0, 0.
    # the episode's advantage cancels by putting both episodes in their own groups (singletons -> 0).
    # Anchor (g, S) per group is a singleton too, so give both episodes one group and compare G directly
    # through norm="none": episode returns 3 and 0 -> +-1.5; anchor S: G = 2, 2, 0, 0, mean 1 -> +-1
    out = gigpo_advantages(torch.tensor([3.0, 0.0]), torch.tensor([7, 7]), torch.tensor([1.0, 2.0, 0.0, 0.0]),
                           torch.tensor([0, 0, 1, 1]), ["S"] * 4, gamma=0.5, norm="none")
    torch.testing.assert_close(out, torch.tensor([2.5, 2.5, -2.5, -2.5]))


def test_interleaved_groups_and_integer_rewards():
    # group ids need not be sorted or compact; integer rewards are taken as float
    out = gigpo_advantages(torch.tensor([1, 0]), torch.tensor([9, 9]), torch.tensor([1, 0]), torch.tensor([0, 1]),
                           [("cell", 3), ("cell", 3)], norm="none")
    torch.testing.assert_close(out, torch.tensor([0.5 + 0.5, -0.5 - 0.5]))


def test_bad_layouts_are_one_clear_error():
    with pytest.raises(ValueError, match="contiguous"):
        gigpo_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.zeros(3), torch.tensor([0, 1, 0]),
                         ["a", "b", "c"])
    with pytest.raises(ValueError, match="one entry per step"):
        gigpo_advantages(torch.tensor([1.0]), torch.tensor([0]), torch.zeros(2), torch.tensor([0, 0]), ["a"])
    with pytest.raises(ValueError, match="norm"):
        advantages(norm="mad")
    with pytest.raises(ValueError, match="index the 1 episodes"):
        gigpo_advantages(torch.tensor([1.0]), torch.tensor([0]), torch.zeros(1), torch.tensor([1]), ["a"])


def test_anchor_group_sizes():
    assert anchor_group_sizes(GROUPS, STEP_EPISODE, STEP_STATE) == [4, 2, 4, 1, 4, 4, 2, 1, 2, 2]
