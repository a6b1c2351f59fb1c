"""GiGPO (Group-in-Group Policy Optimization, verl-agent): a group outcome advantage per episode plus a
step-level advantage from the turns of one task group that start in the same env state.

Layout: episodes e = 0..E-1 with return R_e and task group g(e); steps s = 0..S-1, each of episode
ep(s), with step reward r_s and env state key k_s; the steps of one episode are contiguous and in
order. Then

    A_episode(e) = norm_{g(e)}(R)                        R normalised over the episodes of group g(e)
    G_s          = r_s + gamma * G_{s+1}                 (G_{s+1} = 0 past the episode's last step)
    A_step(s)    = norm_{(g(ep(s)), k_s)}(G)             G normalised over the anchor group: the steps
                                                         of one task group that start in one state
    A(s)         = A_episode(ep(s)) + step_weight * A_step(s)

    norm "std":  (x - mean) / (std + eps)   with the unbiased (n - 1) std
    norm "none": x - mean
A group of one, or whose values are all equal, contributes 0 (algos/group.py's grpo and dr_grpo
estimators, which these are). A state revisited within one episode puts each visit in the anchor group.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from horizonrl.algos.group import group_advantages

NORMS = {"std": "grpo", "none": "dr_grpo"}


def gigpo_advantages(episode_returns: Tensor, episode_group: Tensor, step_rewards: Tensor, step_episode: Tensor,
                     step_state: Sequence[Hashable], gamma: float = 0.95, step_weight: float = 1.0,
                     norm: str = "std", eps: float = 1e-6) -> Tensor:
    """A(s) of every step (module docstring).

    Args:
        episode_returns: [E] float, the outcome return of each episode.
        episode_group: [E] int, the task group (prompt / env seed) of each episode.
        step_rewards: [S] float, the env reward of each step.
        step_episode: [S] int, the episode (index into episode_returns) of each step; the steps of an
            episode are contiguous and in the order they were played.
        step_state: S hashable keys of the state each step starts from (TextEnv.state_key()).
        gamma: discount of the step returns G_s.
        step_weight: weight of the step advantage.
        norm: "std" or "none".
        eps: added to the std.

    Returns:
        [S] advantages, dtype of step_rewards (float32 for integer rewards).
    """
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {', '.join(NORMS)}, got {norm!r}")
    n_steps = step_rewards.shape[0]
    if step_episode.shape != (n_steps,) or len(step_state) != n_steps:
        raise ValueError(f"step_rewards, step_episode and step_state must have one entry per step; got "
                         f"{n_steps}, {tuple(step_episode.shape)} and {len(step_state)}")
    episodes = step_episode.tolist()
    starts = [s for s in range(n_steps) if s == 0 or episodes[s] != episodes[s - 1]]
    if len({episodes[s] for s in starts}) != len(starts):
        raise ValueError("the steps of each episode must be contiguous in step_episode")
    if n_steps and not 0 <= min(episodes) <= max(episodes) < episode_returns.shape[0]:
        raise ValueError(f"step_episode must index the {episode_returns.shape[0]} episodes")
    estimator = NORMS[norm]
    rewards = step_rewards.detach().float() if not step_rewards.dtype.is_floating_point else step_rewards.detach()
    episode_advantage = group_advantages(episode_returns.to(rewards.dtype), episode_group, estimator, eps)

    step_returns = torch.zeros_like(rewards)
    following = 0.0
    for s in reversed(range(n_steps)):
        if s == n_steps - 1 or episodes[s + 1] != episodes[s]:
            following = 0.0
        following = float(rewards[s]) + gamma * following
        step_returns[s] = following

    anchors = anchor_groups(episode_group.tolist(), episodes, step_state).to(rewards.device)
    step_advantage = group_advantages(step_returns, anchors, estimator, eps)
    return episode_advantage[step_episode.long()] + step_weight * step_advantage


def anchor_groups(episode_group: Sequence[int], step_episode: Sequence[int], step_state: Sequence[Hashable]) -> Tensor:
    """[S] long: the anchor group of each step (its task group and the state it starts from), numbered
    in order of first appearance."""
    anchors: dict[tuple, int] = {}
    return torch.tensor([anchors.setdefault((episode_group[e], key), len(anchors))
                         for e, key in zip(step_episode, step_state)], dtype=torch.long)


def anchor_group_sizes(episode_group: Sequence[int], step_episode: Sequence[int],
                       step_state: Sequence[Hashable]) -> list[int]:
    """The size of each step's anchor group."""
    anchors = anchor_groups(episode_group, step_episode, step_state)
    return torch.bincount(anchors)[anchors].tolist() if len(anchors) else []
