"""Unit tests for horizonrl.algos.group: critic-free group advantages and token broadcasting.

Golden values are worked out by hand in the comments / as literal float arithmetic.
"""

import math

import pytest
import torch

from horizonrl.algos.group import ESTIMATORS, broadcast_to_tokens, group_advantages

torch.set_num_threads(1)

TOL = dict(rtol=1e-6, atol=1e-6)
EPS = 1e-6


def t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


def ids(values):
    return torch.tensor(values, dtype=torch.long)


def close(actual, expected, **tol):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), **(tol or TOL))


# Interleaved batch of three groups:
#   group 5 at positions 0, 2, 5, 6: rewards 1, 0, 0, 1   (mean 0.5)
#   group 2 at positions 1, 4, 7:    rewards 1, 1, 1      (constant)
#   group 9 at position 3:           reward 0.7           (singleton)
REWARDS = [1.0, 1.0, 0.0, 0.7, 1.0, 0.0, 1.0, 1.0]
GROUPS = [5, 2, 5, 9, 2, 5, 5, 2]


# ---------------------------------------------------------------------------------------------
# 1. hand-computed golden values
# ---------------------------------------------------------------------------------------------

def test_grpo_by_hand():
    # group 5: deviations +-0.5, sum of squares 1, unbiased var 1/3, std 1/sqrt(3) = 0.5773503
    #   A = +-0.5 / (0.5773503 + 1e-6) = +-0.8660239
    a = 0.5 / (1 / math.sqrt(3) + EPS)
    assert a == pytest.approx(0.8660239, abs=1e-6)
    # group 2 constant -> 0 ; group 9 singleton -> 0
    out = group_advantages(t(REWARDS), ids(GROUPS), "grpo")
    close(out, [a, 0.0, -a, 0.0, 0.0, -a, a, 0.0])


def test_dr_grpo_by_hand():
    out = group_advantages(t(REWARDS), ids(GROUPS), "dr_grpo")
    close(out, [0.5, 0.0, -0.5, 0.0, 0.0, -0.5, 0.5, 0.0])


def test_rloo_by_hand():
    # group 5, r=1: others (0, 0, 1) mean 1/3 -> 2/3 ; r=0: others (1, 0, 1) mean 2/3 -> -2/3
    #   = 4/3 * (+-0.5)
    out = group_advantages(t(REWARDS), ids(GROUPS), "rloo")
    close(out, [2 / 3, 0.0, -2 / 3, 0.0, 0.0, -2 / 3, 2 / 3, 0.0])


def test_reinforce_pp_by_hand():
    # centred: (0.5, 0, -0.5, 0, 0, -0.5, 0.5, 0): batch mean 0, sum of squares 1,
    #   unbiased var 1/7, std = 0.3779645 ; A = c / (0.3779645 + 1e-6) -> +-1.3228722
    a = 0.5 / (math.sqrt(1 / 7) + EPS)
    assert a == pytest.approx(1.3228722, abs=1e-6)
    out = group_advantages(t(REWARDS), ids(GROUPS), "reinforce_pp")
    close(out, [a, 0.0, -a, 0.0, 0.0, -a, a, 0.0])


def test_three_member_group_with_a_spread_by_hand():
    # rewards (3, 1, 2): mean 2, deviations (1, -1, 0), unbiased var (1 + 1 + 0)/2 = 1, std 1
    r, g = t([3.0, 1.0, 2.0]), ids([0, 0, 0])
    close(group_advantages(r, g, "grpo"), [1 / (1 + EPS), -1 / (1 + EPS), 0.0])
    close(group_advantages(r, g, "dr_grpo"), [1.0, -1.0, 0.0])
    # rloo: 3 - mean(1, 2) = 1.5 ; 1 - mean(3, 2) = -1.5 ; 2 - mean(3, 1) = 0
    close(group_advantages(r, g, "rloo"), [1.5, -1.5, 0.0])
    # reinforce_pp: centred (1, -1, 0) already has mean 0 and unbiased std 1
    close(group_advantages(r, g, "reinforce_pp"), [1 / (1 + EPS), -1 / (1 + EPS), 0.0])


def test_grpo_uses_unbiased_std():
    # pair (1, 0): unbiased std = sqrt(0.5/1) = 0.7071068 (population std would be 0.5 -> A = +-1)
    out = group_advantages(t([1.0, 0.0]), ids([3, 3]), "grpo")
    a = 0.5 / (math.sqrt(0.5) + EPS)
    close(out, [a, -a])
    assert a == pytest.approx(0.7071058, abs=1e-6)


# ---------------------------------------------------------------------------------------------
# 2. group order, ids and dtypes
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_interleaved_equals_contiguous(estimator):
    rewards, groups = t(REWARDS), ids(GROUPS)
    order = torch.argsort(groups, stable=True)  # contiguous groups
    contiguous = group_advantages(rewards[order], groups[order], estimator)
    interleaved = group_advantages(rewards, groups, estimator)
    torch.testing.assert_close(interleaved[order], contiguous, **TOL)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_random_permutation_is_equivariant(estimator):
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(23, generator=gen)
    groups = torch.randint(0, 6, (23,), generator=gen)
    base = group_advantages(rewards, groups, estimator)
    for seed in range(3):
        perm = torch.randperm(23, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(group_advantages(rewards[perm], groups[perm], estimator), base[perm],
                                   **TOL)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_group_id_values_do_not_matter(estimator):
    relabelled = [{5: -7, 2: 10**12, 9: 0}[g] for g in GROUPS]
    torch.testing.assert_close(group_advantages(t(REWARDS), ids(relabelled), estimator),
                               group_advantages(t(REWARDS), ids(GROUPS), estimator), rtol=0, atol=0)


def test_dtypes():
    out64 = group_advantages(t(REWARDS, torch.float64), ids(GROUPS), "grpo")
    assert out64.dtype == torch.float64
    # integer / bool rewards become float32
    out_int = group_advantages(torch.tensor([1, 0, 0, 1]), ids([0, 0, 0, 0]), "dr_grpo")
    assert out_int.dtype == torch.float32
    close(out_int, [0.5, -0.5, -0.5, 0.5])
    out_bool = group_advantages(torch.tensor([True, False]), ids([0, 0]), "rloo")
    close(out_bool, [1.0, -1.0])


def test_no_grad_flows_to_rewards():
    r = t(REWARDS).requires_grad_()
    assert not group_advantages(r, ids(GROUPS), "grpo").requires_grad


# ---------------------------------------------------------------------------------------------
# 3. constant groups and singletons
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_constant_groups_are_exactly_zero(estimator, dtype):
    # 0.1 and 0.7 are not representable: sum/n - r can round to a tiny non-zero number, which GRPO
    # would amplify by dividing by std + eps ~ 1e-6 (6e-8 -> 0.06). It must be exactly 0.
    # (seven 0.7s: sum/7 - 0.7 = 6e-8 in float32; three 0.7s: 1e-16 in float64.)
    rewards = t([0.1, 0.7, 0.1, 0.7, 0.1, 0.7, 0.1, -3.3, -3.3] + [0.7] * 7, dtype)
    groups = ids([0, 1, 0, 1, 0, 1, 0, 2, 2] + [3] * 7)
    sums = torch.zeros(4, dtype=dtype).index_add_(0, groups, rewards)
    naive = rewards - sums[groups] / torch.bincount(groups)[groups]
    assert (naive != 0).any()  # the rounding hazard is really exercised
    out = group_advantages(rewards, groups, estimator)
    assert torch.all(out == 0)


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_singletons_are_zero(estimator):
    out = group_advantages(t([0.3, 1.0, -2.0]), ids([0, 1, 2]), estimator)
    assert torch.all(out == 0)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_all_constant_batch_is_zero(estimator):
    out = group_advantages(t([1.0, 1.0, 0.0, 0.0, 0.5]), ids([0, 0, 1, 1, 2]), estimator)
    assert torch.all(out == 0) and torch.isfinite(out).all()


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_single_episode_and_empty_batch(estimator):
    close(group_advantages(t([0.9]), ids([4]), estimator), [0.0])
    assert group_advantages(t([]), ids([]), estimator).shape == (0,)


# ---------------------------------------------------------------------------------------------
# 4. references computed with Python loops
# ---------------------------------------------------------------------------------------------

def _random_batch(seed, n=30, n_groups=7):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(n, generator=gen, dtype=torch.float64)
    groups = torch.randint(0, n_groups, (n,), generator=gen)
    return rewards, groups


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_rloo_matches_leave_one_out_loop(seed):
    rewards, groups = _random_batch(seed)
    out = group_advantages(rewards, groups, "rloo")
    r, g = rewards.tolist(), groups.tolist()
    for i in range(len(r)):
        others = [r[j] for j in range(len(r)) if g[j] == g[i] and j != i]
        expected = r[i] - sum(others) / len(others) if others else 0.0
        assert out[i].item() == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_grpo_and_dr_grpo_match_per_group_torch_std(seed):
    rewards, groups = _random_batch(seed)
    grpo = group_advantages(rewards, groups, "grpo")
    dr = group_advantages(rewards, groups, "dr_grpo")
    for gid in groups.unique():
        members = groups == gid
        r = rewards[members]
        if r.numel() == 1:
            assert grpo[members].item() == 0.0 and dr[members].item() == 0.0
            continue
        torch.testing.assert_close(dr[members], r - r.mean(), rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(grpo[members], (r - r.mean()) / (torch.std(r) + EPS),
                                   rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_reinforce_pp_is_whitened_dr_grpo(seed):
    rewards, groups = _random_batch(seed)
    out = group_advantages(rewards, groups, "reinforce_pp")
    assert out.mean().item() == pytest.approx(0.0, abs=1e-9)
    assert out.std().item() == pytest.approx(1.0, abs=1e-5)  # eps in the denominator
    c = group_advantages(rewards, groups, "dr_grpo")
    torch.testing.assert_close(out, (c - c.mean()) / (c.std() + EPS), rtol=1e-9, atol=1e-9)


def test_reinforce_pp_moments_float32():
    gen = torch.Generator().manual_seed(5)
    rewards = (torch.rand(64, generator=gen) < 0.4).float()  # binary success rewards
    groups = torch.arange(64) % 8                            # 8 groups of 8, interleaved
    out = group_advantages(rewards, groups, "reinforce_pp")
    assert out.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert out.std().item() == pytest.approx(1.0, abs=1e-5)


# ---------------------------------------------------------------------------------------------
# 5. errors
# ---------------------------------------------------------------------------------------------

def test_unknown_estimator_lists_valid_names():
    with pytest.raises(ValueError) as info:
        group_advantages(t(REWARDS), ids(GROUPS), "ppo")
    for name in ESTIMATORS:
        assert name in str(info.value)


def test_bad_shapes_raise():
    with pytest.raises(ValueError):
        group_advantages(t([1.0, 2.0]), ids([0, 0, 0]), "grpo")
    with pytest.raises(ValueError):
        group_advantages(t([[1.0, 2.0]]), ids([[0, 0]]), "grpo")
    with pytest.raises(ValueError):
        group_advantages(t([1.0, 2.0]), t([0.0, 0.0]), "grpo")


# ---------------------------------------------------------------------------------------------
# 6. broadcast_to_tokens
# ---------------------------------------------------------------------------------------------

def test_broadcast_by_hand():
    adv = t([0.5, -1.25, 2.0])
    # rows: episode 1 (turn 1), episode 0, episode 1 (turn 2), episode 2; masks with gaps/padding
    row_episode = ids([1, 0, 1, 2])
    mask = t([[1, 1, 0, 0],
              [0, 1, 1, 1],
              [1, 0, 1, 0],
              [0, 0, 0, 0]])
    out = broadcast_to_tokens(adv, row_episode, mask)
    close(out, [[-1.25, -1.25, 0.0, 0.0],
                [0.0, 0.5, 0.5, 0.5],
                [-1.25, 0.0, -1.25, 0.0],
                [0.0, 0.0, 0.0, 0.0]], rtol=0, atol=0)


def test_broadcast_every_mask_token_and_zero_elsewhere():
    gen = torch.Generator().manual_seed(1)
    adv = torch.randn(6, generator=gen) + 10.0  # no episode advantage is 0
    row_episode = torch.randint(0, 6, (15,), generator=gen)
    mask = (torch.rand(15, 9, generator=gen) < 0.5).long()
    out = broadcast_to_tokens(adv, row_episode, mask)
    assert out.shape == (15, 9) and out.dtype == adv.dtype
    on = mask.bool()
    expected = adv[row_episode][:, None].expand(15, 9)
    assert torch.equal(out[on], expected[on])
    assert torch.all(out[~on] == 0)


def test_broadcast_of_group_advantages_end_to_end():
    # 4 episodes of one task (rewards 1, 0, 0, 1), 2 turns each -> rows of episode e are 2e, 2e+1
    adv = group_advantages(t([1.0, 0.0, 0.0, 1.0]), ids([0, 0, 0, 0]), "dr_grpo")
    row_episode = torch.arange(8) // 2
    mask = torch.ones(8, 3)
    mask[:, 2] = 0
    out = broadcast_to_tokens(adv, row_episode, mask)
    signs = [1, 1, -1, -1, -1, -1, 1, 1]
    close(out, [[0.5 * s, 0.5 * s, 0.0] for s in signs])


def test_broadcast_errors():
    with pytest.raises(ValueError):
        broadcast_to_tokens(t([1.0]), ids([0, 1]), torch.ones(2, 3))  # episode 1 out of range
    with pytest.raises(ValueError):
        broadcast_to_tokens(t([1.0]), ids([-1]), torch.ones(1, 3))
    with pytest.raises(ValueError):
        broadcast_to_tokens(t([1.0]), ids([0, 0]), torch.ones(3, 3))  # row count mismatch
    with pytest.raises(ValueError):
        broadcast_to_tokens(t([1.0]), ids([0]), torch.ones(3))
