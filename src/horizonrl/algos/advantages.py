"""Advantage estimators: dual-discount GAE over turns, and whitening.

Layout: one row per turn, response tokens left-aligned. Token k of row i is the action a_{i,k};
`values[i, k]` is V(s_{i,k}), the value of the state before that token, so `values[i, 0]` is the
value of the turn's prompt.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def dual_discount_gae(
    token_rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    episode_end: Tensor,
    next_row: Tensor,
    bootstrap_value: Tensor,
    gamma_step: float = 0.99,
    lambda_step: float = 0.95,
    gamma_token: float = 1.0,
    lambda_token: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation with separate discounts inside a turn and between turns.

    Walking backwards, with n_i the number of response tokens of row i:

        delta_{i,k} = r_{i,k} + g * V_next - V_{i,k}
        A_{i,k}     = delta_{i,k} + g * l * A_next

    Inside a turn (k < n_i - 1): V_next = V_{i,k+1}, A_next = A_{i,k+1}, (g, l) = (gamma_token,
    lambda_token). On the link after the last token (k = n_i - 1), (g, l) = (gamma_step, lambda_step)
    and:
      - episode_end[i]:          V_next = 0,                  A_next = 0  (accumulator resets)
      - next_row[i] = j >= 0:    V_next = V_{j,0},            A_next = A_{j,0}
      - otherwise (batch cut or time-limit truncation):
                                 V_next = bootstrap_value[i], A_next = 0

    With token gamma = lambda = 1 and a reward r only at the end this gives, for the last turn,
    A = r - V_t and, for the turn before, A = gamma_s * (lambda_s * r + (1 - lambda_s) * V_{last,0}) - V_t.
    With step and token parameters equal it is ordinary GAE over the policy's tokens.

    Args:
        token_rewards, values, response_mask: [N, L] float; mask 1 on a left-aligned run of >= 1
            sampled tokens per row, 0 on padding.
        episode_end: [N] bool, the episode terminated after this turn.
        next_row: [N] long, row of the next turn of the same episode, or -1 if not in the batch.
        bootstrap_value: [N] float, V(s_{T+1}) where next_row == -1 and not episode_end.

    Returns:
        (advantages, returns), both [N, L], zero where the mask is 0; returns = advantages + values.
        Not whitened.
    """
    n_rows, width = values.shape
    mask = response_mask.bool()
    lengths = mask.sum(dim=1)
    positions = torch.arange(width, device=values.device)
    if bool((lengths == 0).any()) or not torch.equal(mask, positions < lengths[:, None]):
        raise ValueError("response_mask must hold one left-aligned run of at least one token per row")
    episode_end = episode_end.bool()
    next_row = next_row.long()
    links = (next_row >= 0) & ~episode_end

    values = values.detach().float()
    rewards = token_rewards.detach().float()
    advantages = torch.zeros_like(values)
    gl_token = gamma_token * lambda_token
    gl_step = gamma_step * lambda_step
    for rows in _rows_by_distance_to_chain_end(next_row.tolist(), links.tolist()):
        rows = torch.tensor(rows, device=values.device)
        linked = links[rows]
        successor = next_row[rows].clamp(min=0)
        after_value = torch.where(linked, values[successor, 0], bootstrap_value[rows].float())
        after_value = torch.where(episode_end[rows], torch.zeros_like(after_value), after_value)
        after_adv = torch.where(linked, advantages[successor, 0], torch.zeros_like(after_value))
        last = lengths[rows] - 1

        next_value = torch.zeros(len(rows), device=values.device)
        next_adv = torch.zeros(len(rows), device=values.device)
        for k in range(width - 1, -1, -1):
            is_last = last == k
            g = torch.where(is_last, gamma_step, gamma_token)
            gl = torch.where(is_last, gl_step, gl_token)
            v_next = torch.where(is_last, after_value, next_value)
            a_next = torch.where(is_last, after_adv, next_adv)
            v_k = values[rows, k]
            a_k = rewards[rows, k] + g * v_next - v_k + gl * a_next
            a_k = torch.where(k <= last, a_k, torch.zeros_like(a_k))
            advantages[rows, k] = a_k
            next_value, next_adv = v_k, a_k

    advantages = advantages * mask
    returns = (advantages + values) * mask
    return advantages, returns


def _rows_by_distance_to_chain_end(next_row: list[int], linked: list[bool]) -> list[list[int]]:
    """Group rows by how many links separate them from the end of their chain, nearest first.

    Every row's successor lands in an earlier group, so groups can be processed in order.
    """
    n_rows = len(next_row)
    distance: list[int | None] = [None] * n_rows
    for start in range(n_rows):
        path: list[int] = []
        on_path: set[int] = set()
        row = start
        while distance[row] is None and linked[row]:
            if row in on_path:
                raise ValueError(f"next_row has a cycle through row {row}")
            path.append(row)
            on_path.add(row)
            row = next_row[row]
            if not 0 <= row < n_rows:
                raise ValueError(f"next_row points to row {row}, outside 0..{n_rows - 1}")
        if distance[row] is None:
            distance[row] = 0
        for hops, r in enumerate(reversed(path), start=1):
            distance[r] = distance[row] + hops
    groups: list[list[int]] = [[] for _ in range(max(distance, default=-1) + 1)]
    for row, d in enumerate(distance):
        groups[d].append(row)
    return groups


def whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8,
           total: Callable[[Tensor], Tensor] = lambda t: t) -> Tensor:
    """(x - mean) / sqrt(var + eps) over masked entries (population variance); zero where mask is 0.

    With shift_mean=False the mean is added back: only the scale changes. `total` turns a local sum
    into the sum over every process holding part of the batch (identity: this process alone).
    """
    mask = mask.to(x.dtype)
    count = total(mask.sum()).clamp(min=1)
    mean = total((x * mask).sum()) / count
    var = total((((x - mean) * mask) ** 2).sum()) / count
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask
