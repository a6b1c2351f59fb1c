"""Turn-level credit without length bias: on an MDP whose policy decides when to stop, each advantage estimator's
mean policy gradient against the exact gradient, enumerated.

The MDP: turns t = 0, 1, 2; at each the policy continues with probability p_t = sigmoid(theta_t) (a tabular policy)
or stops. Continuing earns the intermediate reward C; stopping at t earns STOP[t] and ends the episode; continuing
at t = 2 ends it too. Four trajectories, enumerable: J(theta) = sum P(trajectory) x return, dJ/dtheta by autograd.

A batch is GROUPS groups of N trajectories from the start; an estimator gives every step an advantage A and the
gradient estimate of a group is (1/N) sum_i sum_t A_it d log pi(a_it | t) / d theta. Its mean over groups should be
k x the exact gradient, with k derived for each estimator:
    dual-discount GAE (gamma 1, lambda 0.95) on the exact values V(t):  k = 1
    RLOO (leave-one-out baseline):                                       k = 1
    Dr.GRPO (the group mean, itself included):                           k = (N - 1) / N
    GiGPO's step term without std (the mean of the steps that start at t in the group, itself included): a factor
        per turn, k_t = 1 - (1 - (1 - q_t)^N) / (N q_t), q_t the probability of reaching t: given the N_t ~ Bin(N, q_t)
        steps at t, a step's advantage is (N_t - 1) / N_t times its leave-one-out one, summed over N_t of them.
Each within 3 standard errors (over groups) per component. The std-normalised ones (GRPO, GiGPO with std) have no
such k: their cosine with the exact gradient and the sign of each component are checked instead.

What fails the same check (so the check can fail): per-turn credit "normalised by turn index" as verl RFC #7244
describes it: each turn's own reward, centred on the mean reward of the group's turns with the same index. A
continue decision never sees the reward its episode earns later, so its credit is biased toward the immediate C.
"""

import math

import pytest
import torch

from horizonrl.algos.advantages import dual_discount_gae
from horizonrl.algos.gigpo import gigpo_advantages
from horizonrl.algos.group import group_advantages

C = 0.3
STOP = torch.tensor([0.0, 1.0, 0.2], dtype=torch.float64)
THETA = torch.tensor([0.4, -0.2, 0.1], dtype=torch.float64)
TURNS, N, GROUPS = 3, 4, 25_000


def trajectories():
    """(turns played, steps' actions (1 continue, 0 stop), steps' rewards) of the four trajectories."""
    out = []
    for stop in range(TURNS + 1):           # stop at turn `stop`, or never (stop == TURNS)
        actions = [1] * min(stop, TURNS) + ([0] if stop < TURNS else [])
        rewards = [C] * min(stop, TURNS) + ([float(STOP[stop])] if stop < TURNS else [])
        out.append((len(actions), actions, rewards))
    return out


def exact():
    """(dJ/dtheta, V(t) for t = 0..2, q_t the probability of reaching turn t)."""
    theta = THETA.clone().requires_grad_(True)
    p = torch.sigmoid(theta)
    J = 0.0
    for _, actions, rewards in trajectories():
        probability = math.prod(p[t] if a else 1 - p[t] for t, a in enumerate(actions))
        J = J + probability * sum(rewards)
    (gradient,) = torch.autograd.grad(J, theta)
    p = p.detach()
    values = [0.0] * (TURNS + 1)
    for t in reversed(range(TURNS)):
        values[t] = float(p[t] * (C + values[t + 1]) + (1 - p[t]) * STOP[t])
    reach = [float(torch.prod(p[:t])) for t in range(TURNS)]
    return gradient, torch.tensor(values[:TURNS], dtype=torch.float64), torch.tensor(reach, dtype=torch.float64)


def sample(seed: int = 0):
    """GROUPS x N trajectories: per step its episode, turn, action and reward (episodes contiguous)."""
    generator = torch.Generator().manual_seed(seed)
    p = torch.sigmoid(THETA)
    continues = torch.rand(GROUPS * N, TURNS, generator=generator, dtype=torch.float64) < p
    stop_turn = torch.where(~continues, torch.arange(TURNS), TURNS).min(dim=1).values   # TURNS: never stopped
    episodes, turns, actions, rewards = [], [], [], []
    for episode, stop in enumerate(stop_turn.tolist()):
        played = min(stop + 1, TURNS)
        for t in range(played):
            go = t < stop
            episodes.append(episode), turns.append(t), actions.append(int(go))
            rewards.append(C if go else float(STOP[t]))
    as_tensor = lambda x, dtype: torch.tensor(x, dtype=dtype)   # noqa: E731
    return (as_tensor(episodes, torch.long), as_tensor(turns, torch.long), as_tensor(actions, torch.long),
            as_tensor(rewards, torch.float64))


def group_gradients(advantages, episodes, turns, actions):
    """[GROUPS, TURNS]: each group's (1/N) sum of A x d log pi / d theta; d/dtheta_t log pi(continue | t) = 1 - p_t,
    log pi(stop | t): -p_t."""
    p = torch.sigmoid(THETA)[turns]
    score = torch.where(actions.bool(), 1 - p, -p)
    per_step = torch.zeros(GROUPS * N, TURNS, dtype=torch.float64)
    per_step.index_put_((episodes, turns), advantages * score, accumulate=True)
    return per_step.view(GROUPS, N, TURNS).sum(dim=1) / N


def episode_returns(episodes, rewards):
    return torch.zeros(GROUPS * N, dtype=torch.float64).index_add_(0, episodes, rewards)


def gae(episodes, turns, actions, rewards, values):
    last = torch.cat([episodes[1:] != episodes[:-1], torch.tensor([True])])
    rows = len(episodes)
    advantages, _ = dual_discount_gae(rewards[:, None].float(), values[turns][:, None].float(), torch.ones(rows, 1),
                                      last, torch.where(last, -1, torch.arange(1, rows + 1)), torch.zeros(rows),
                                      gamma_step=1.0, lambda_step=0.95)
    return advantages[:, 0].double()


def outcome(estimator, episodes, rewards):
    returns = episode_returns(episodes, rewards)
    group = torch.arange(GROUPS * N) // N
    return group_advantages(returns, group, estimator)[episodes]


def gigpo_step(norm, episodes, turns, rewards):
    """GiGPO with the episode term 0 (every return 0: a constant group), so only the step term remains."""
    group = torch.arange(GROUPS * N) // N
    return gigpo_advantages(torch.zeros(GROUPS * N, dtype=torch.float64), group, rewards, episodes,
                            turns.tolist(), gamma=1.0, norm=norm)


def per_turn_index(episodes, turns, rewards):
    """#7244's credit: each turn's own reward minus the mean reward of the group's turns with the same index."""
    group = (episodes // N) * TURNS + turns
    return group_advantages(rewards, group, "dr_grpo")


@pytest.fixture(scope="module")
def setting():
    return exact(), sample()


def mean_and_error(gradients):
    return gradients.mean(dim=0), gradients.std(dim=0) / math.sqrt(GROUPS)


@pytest.mark.parametrize("name", ["gae", "rloo", "dr_grpo", "gigpo_step"])
def test_unbiased_estimators_follow_the_exact_gradient(setting, name):
    (gradient, values, reach), (episodes, turns, actions, rewards) = setting
    advantages = {"gae": lambda: gae(episodes, turns, actions, rewards, values),
                  "rloo": lambda: outcome("rloo", episodes, rewards),
                  "dr_grpo": lambda: outcome("dr_grpo", episodes, rewards),
                  "gigpo_step": lambda: gigpo_step("none", episodes, turns, rewards)}[name]()
    k = {"gae": torch.ones(TURNS), "rloo": torch.ones(TURNS), "dr_grpo": torch.full((TURNS,), (N - 1) / N),
         "gigpo_step": 1 - (1 - (1 - reach) ** N) / (N * reach)}[name].double()
    mean, error = mean_and_error(group_gradients(advantages, episodes, turns, actions))
    print(f"{name}: mean {mean.tolist()}, k x exact {(k * gradient).tolist()}, standard error {error.tolist()}")
    assert ((mean - k * gradient).abs() <= 3 * error).all(), (mean, k * gradient, error)


@pytest.mark.parametrize("name", ["grpo", "gigpo_std"])
def test_std_normalised_estimators_point_the_same_way(setting, name):
    (gradient, _, _), (episodes, turns, actions, rewards) = setting
    advantages = outcome("grpo", episodes, rewards) if name == "grpo" else gigpo_step("std", episodes, turns, rewards)
    mean, _ = mean_and_error(group_gradients(advantages, episodes, turns, actions))
    cosine = float(mean @ gradient / (mean.norm() * gradient.norm()))
    print(f"{name}: cosine with the exact gradient {cosine:.4f}, signs {mean.sign().tolist()}")
    assert cosine > 0.9 and torch.equal(mean.sign(), gradient.sign())


def test_per_turn_index_credit_fails_the_same_check(setting):
    (gradient, _, _), (episodes, turns, actions, rewards) = setting
    mean, error = mean_and_error(group_gradients(per_turn_index(episodes, turns, rewards), episodes, turns, actions))
    best = float(mean @ gradient / (gradient @ gradient))           # the k that fits it best, any k
    print(f"per turn index: mean {mean.tolist()}, exact {gradient.tolist()}")
    assert ((mean - best * gradient).abs() > 3 * error).any()
