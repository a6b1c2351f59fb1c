"""Role-conditioned advantage estimation (RAE; SPIRAL, Liu et al. 2025, arXiv:2506.24119): self-play's baseline,
one per role, carried from batch to batch.

A role is a game and a seat (`openspiel:kuhn_poker/seat0`): the seats of one game do not win alike (Kuhn poker's
first player is behind by 1/18 of a chip at equilibrium), so a baseline shared by both would score every move of a
seat by which seat it was. Role k keeps an exponential moving average b_k of its returns, from b_k = 0:

    b_k <- decay * b_k + (1 - decay) * mean_{i : role(i) = k} R_i       once a batch, before the advantages
    A_i  = R_i - b_role(i)                                              on every turn of episode i (gamma 1)

A role with no episode in the batch keeps its baseline. SPIRAL's decay is 0.95.

What it simplifies, as SPIRAL does: no division by a standard deviation, one return per episode (its outcome),
and no baseline per state: the baseline centres a role's returns, the policy gradient does the rest.
"""

from __future__ import annotations

import torch
from torch import Tensor


def rae_advantages(returns: Tensor, role_index: Tensor, baselines: Tensor, decay: float) -> tuple[Tensor, Tensor]:
    """The advantages of a batch and the roles' baselines after it (module docstring).

    Args:
        returns: [N] float, each episode's return R_i.
        role_index: [N] long in 0..K-1, each episode's role.
        baselines: [K] float, the roles' baselines before this batch.
        decay: the EMA's weight on the old baseline, in [0, 1).

    Returns:
        (advantages [N], baselines [K] after the batch's update).
    """
    if returns.dim() != 1 or role_index.shape != returns.shape:
        raise ValueError(f"returns and role_index must both be [N]; got {tuple(returns.shape)} "
                         f"and {tuple(role_index.shape)}")
    if not 0 <= decay < 1:
        raise ValueError(f"decay must be in [0, 1); got {decay}")
    counts = torch.zeros_like(baselines).index_add_(0, role_index, torch.ones_like(returns))
    sums = torch.zeros_like(baselines).index_add_(0, role_index, returns)
    seen = counts > 0
    updated = torch.where(seen, decay * baselines + (1 - decay) * sums / counts.clamp(min=1), baselines)
    return returns - updated[role_index], updated


class RoleBaselines:
    """Every role's baseline by name, the run's state across batches (saved with its checkpoints, restored on
    resume: runstate/checkpoint.py)."""

    def __init__(self, decay: float = 0.95):
        self.decay = decay
        self.values: dict[str, float] = {}

    def advantages(self, returns: Tensor, roles: list[str]) -> Tensor:
        """`rae_advantages` of a batch whose episode i plays `roles[i]`; the baselines move on."""
        names = list(dict.fromkeys([*self.values, *roles]))
        before = torch.tensor([self.values.get(name, 0.0) for name in names], dtype=returns.dtype,
                              device=returns.device)
        index = torch.tensor([names.index(role) for role in roles], dtype=torch.long, device=returns.device)
        advantages, after = rae_advantages(returns, index, before, self.decay)
        self.values = dict(zip(names, after.tolist(), strict=True))
        return advantages

    def state_dict(self) -> dict[str, float]:
        return dict(self.values)

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.values = {name: float(value) for name, value in state.items()}
