"""estimate_advantages (train/batch.py): token rewards (env reward on a turn's last token, -kl_coef * KL
on every token), the turn links and the bootstrap value fed to dual-discount GAE, and the result put
back on the right row positions.

Scores are set by hand in the row layout; the expected values come from `dual_discount_gae` called
directly on hand-built turn-layout inputs, and from GAE worked out by hand in the comments.
"""

import dataclasses

import pytest
import torch

from horizonrl.algos.advantages import dual_discount_gae
from horizonrl.config import PPOConfig
from horizonrl.records import Episode, Turn
from horizonrl.samples.per_turn import per_turn
from horizonrl.samples.tensors import Rows, TurnIndex
from horizonrl.train.batch import PPOBatch
from horizonrl.train.ppo import estimate_advantages

torch.set_num_threads(1)

PAD = 0
G_STEP, L_STEP, G_TOKEN, L_TOKEN, KL_COEF = 0.9, 0.8, 0.95, 0.5, 0.1
PPO = PPOConfig(kl_coef=KL_COEF, kl_estimator="k1", gamma_step=G_STEP, lambda_step=L_STEP,
                gamma_token=G_TOKEN, lambda_token=L_TOKEN, whiten_advantages=False)
V_BOOT = 0.8

# Three turns of one episode, one row each (per_turn); response positions (row, column):
#   turn 0: prompt [1 2],           response [3 4] -> (0, 2), (0, 3)  env reward 0.5
#   turn 1: prompt [1 2 3 4 5],     response [6]   -> (1, 5)          env reward 0.0
#   turn 2: prompt [1 2 3 4 5 6 7], response [8 9] -> (2, 7), (2, 8)  env reward 1.0
POSITIONS = [[(0, 2), (0, 3)], [(1, 5)], [(2, 7), (2, 8)]]
LOGP_OLD = [[-1.0, -0.5], [-2.0], [-0.3, -0.7]]
LOGP_REF = [[-1.2, -0.5], [-1.5], [-0.3, -1.0]]
VALUES = [[0.4, 0.6], [0.3], [0.2, 0.5]]
ENV_REWARDS = [0.5, 0.0, 1.0]


def episode(terminated: bool) -> Episode:
    turns = [Turn([1, 2], [3, 4], None, 0.5), Turn([1, 2, 3, 4, 5], [6], None, 0.0),
             Turn([1, 2, 3, 4, 5, 6, 7], [8, 9], None, 1.0, terminated=terminated)]
    return Episode("e", "t", 0, turns=turns, bootstrap_prompt_ids=None if terminated else list(range(1, 12)))


def by_hand(per_turn_values) -> torch.Tensor:
    """[3, 9] row-layout tensor with the given per-turn token values at POSITIONS, 0 elsewhere."""
    out = torch.zeros(3, 9)
    for positions, values in zip(POSITIONS, per_turn_values):
        for (row, col), value in zip(positions, values):
            out[row, col] = value
    return out


def batch_of(terminated: bool) -> PPOBatch:
    samples = per_turn([episode(terminated)])
    data = Rows.of(samples, PAD, torch.device("cpu"))
    assert torch.equal(data.loss_mask, by_hand([[1, 1], [1], [1, 1]]))
    data = dataclasses.replace(data, logp_old=by_hand(LOGP_OLD), logp_ref=by_hand(LOGP_REF), values_old=by_hand(VALUES))
    bootstrap = torch.zeros(0) if terminated else torch.tensor([V_BOOT])
    return PPOBatch([episode(terminated)], samples, TurnIndex.of(samples), data, bootstrap)


def direct_gae(terminated: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """dual_discount_gae on the turn layout [3 turns, 2 tokens], its inputs built here by hand."""
    # k1 KL = logp_old - logp_ref: [0.2, 0.0], [-0.5], [0.0, 0.3]; KL reward -0.1 * KL on every token;
    # env reward added on each turn's last token.
    rewards = torch.tensor([[-KL_COEF * 0.2, -KL_COEF * 0.0 + 0.5],
                            [-KL_COEF * -0.5 + 0.0, 0.0],
                            [-KL_COEF * 0.0, -KL_COEF * 0.3 + 1.0]])
    values = torch.tensor([[0.4, 0.6], [0.3, 0.0], [0.2, 0.5]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    advantages, returns = dual_discount_gae(
        rewards, values, mask, episode_end=torch.tensor([False, False, terminated]),
        next_row=torch.tensor([1, 2, -1]), bootstrap_value=torch.tensor([0.0, 0.0, 0.0 if terminated else V_BOOT]),
        gamma_step=G_STEP, lambda_step=L_STEP, gamma_token=G_TOKEN, lambda_token=L_TOKEN)
    to_list = lambda x: [[x[0, 0], x[0, 1]], [x[1, 0]], [x[2, 0], x[2, 1]]]  # noqa: E731
    return by_hand(to_list(advantages)), by_hand(to_list(returns))


@pytest.mark.parametrize("terminated", [False, True], ids=["cut-bootstraps", "terminated"])
def test_advantages_equal_dual_discount_gae_on_hand_built_token_rewards(terminated):
    batch = batch_of(terminated)
    estimate_advantages(batch, PPO)
    advantages, returns = direct_gae(terminated)
    torch.testing.assert_close(batch.rows.advantages, advantages, rtol=0, atol=1e-6)
    torch.testing.assert_close(batch.rows.returns, returns, rtol=0, atol=1e-6)


def test_advantages_of_a_cut_episode_by_hand():
    # Token rewards: turn 0 [-0.02, 0.5], turn 1 [0.05], turn 2 [0.0, 0.97] (see direct_gae).
    # Backwards; inside a turn g = 0.95, g*l = 0.475; on a turn link g = 0.9, g*l = 0.72.
    #   A(2,1) = 0.97 + 0.9 * V_boot(0.8) - 0.5                      = 1.19
    #   A(2,0) = 0.0 + 0.95 * 0.5 - 0.2 + 0.475 * 1.19               = 0.275 + 0.56525 = 0.84025
    #   A(1,0) = 0.05 + 0.9 * V(2,0)=0.2 - 0.3 + 0.72 * 0.84025      = -0.07 + 0.60498 = 0.53498
    #   A(0,1) = 0.5 + 0.9 * V(1,0)=0.3 - 0.6 + 0.72 * 0.53498       = 0.17 + 0.3851856 = 0.5551856
    #   A(0,0) = -0.02 + 0.95 * 0.6 - 0.4 + 0.475 * 0.5551856        = 0.15 + 0.2637132 = 0.4137132
    # returns = advantages + values.
    batch = batch_of(terminated=False)
    estimate_advantages(batch, PPO)
    hand = [[0.4137132, 0.5551856], [0.53498], [0.84025, 1.19]]
    torch.testing.assert_close(batch.rows.advantages, by_hand(hand), rtol=0, atol=1e-6)
    returns = [[a + v for a, v in zip(adv, val)] for adv, val in zip(hand, VALUES)]
    torch.testing.assert_close(batch.rows.returns, by_hand(returns), rtol=0, atol=1e-6)


def test_after_a_terminated_last_turn_the_next_value_is_zero():
    # A(2,1) = 0.97 + 0 - 0.5 = 0.47;  A(2,0) = 0.95 * 0.5 - 0.2 + 0.475 * 0.47 = 0.275 + 0.22325 = 0.49825
    batch = batch_of(terminated=True)
    estimate_advantages(batch, PPO)
    assert batch.rows.advantages[2, 8].item() == pytest.approx(0.47, abs=1e-6)
    assert batch.rows.advantages[2, 7].item() == pytest.approx(0.49825, abs=1e-6)


def test_each_cut_episode_bootstraps_from_its_own_prompts_value():
    # Two one-turn fragments, both cut: one-token responses, zero KL (logp_old == logp_ref = 0), no env
    # reward, value 0, so A = gamma_step * V_boot: 0.9 * 2.0 = 1.8 and 0.9 * -1.0 = -0.9.
    episodes = [Episode(name, "t", 0, turns=[Turn([1, 2], [3], None)], bootstrap_prompt_ids=[1, 2, 3, 4])
                for name in ("a", "b")]
    samples = per_turn(episodes)
    data = Rows.of(samples, PAD)
    data = dataclasses.replace(data, logp_old=torch.zeros(2, 3), logp_ref=torch.zeros(2, 3),
                               values_old=torch.zeros(2, 3))
    batch = PPOBatch(episodes, samples, TurnIndex.of(samples), data, torch.tensor([2.0, -1.0]))
    estimate_advantages(batch, PPO)
    torch.testing.assert_close(batch.rows.advantages, torch.tensor([[0, 0, 1.8], [0, 0, -0.9]]))
