"""The algorithms by name, and what each trains on and needs: `algorithm(name)` looks one up, as
`envs.make` looks an env up; an unknown name is one error listing the names.

Every part of the trainer that depends on the algorithm reads a fact of its row here (which batches it plays,
whether it has a critic, whether it needs step credit, its group estimator), never the name itself. A new
algorithm is a row (and an advantage function in algos/ when it is a new family).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from horizonrl.errors import look_up


class Batches(Enum):
    """What one iteration collects."""

    STREAMS = "fixed-turn streams"   # rollout.n_env env streams x ppo.e_len turns; episodes cross iterations
    GROUPS = "episode groups"        # group.n_tasks tasks x group.group_size whole episodes, a seed per task


@dataclass(frozen=True)
class AlgorithmSpec:
    batches: Batches
    description: str
    critic: bool = False            # a value model: a critic warmup (iteration 0), per-token rewards (the KL in the
    #                                 reward, ppo.kl_coef) and dual-discount GAE (algos/advantages.py)
    step_credit: bool = False       # reads each turn's env state_key (algos/gigpo.py): an env, not a task
    estimator: str | None = None    # the outcome estimator of algos/group.py; None: none (ppo), configured (gigpo)
    #                                 or a role's baseline (rae)
    role_baseline: bool = False     # the outcome against its role's moving baseline (algos/rae.py), not a group's


REGISTRY: dict[str, AlgorithmSpec] = {
    "ppo": AlgorithmSpec(Batches.STREAMS, "PPO with dual-discount GAE and a critic", critic=True),
    "grpo": AlgorithmSpec(Batches.GROUPS, "GRPO: reward minus the group mean, over the group std", estimator="grpo"),
    "dr_grpo": AlgorithmSpec(Batches.GROUPS, "Dr.GRPO: reward minus the group mean", estimator="dr_grpo"),
    "rloo": AlgorithmSpec(Batches.GROUPS, "RLOO: reward minus the mean of the others", estimator="rloo"),
    "reinforce_pp": AlgorithmSpec(Batches.GROUPS, "REINFORCE++-baseline: group-centred, batch-whitened",
                                  estimator="reinforce_pp"),
    "gigpo": AlgorithmSpec(Batches.GROUPS, "GiGPO: the group advantage plus a step advantage among turns from the "
                           "same env state", step_credit=True),
    "rae": AlgorithmSpec(Batches.GROUPS, "RAE (SPIRAL): the return minus a moving baseline per game and seat",
                         role_baseline=True),
}
ALGORITHMS = tuple(REGISTRY)


def algorithm(name: str) -> AlgorithmSpec:
    """The registry row of `name`; an unknown name is a ValueError listing the names."""
    return look_up(REGISTRY, name, "algorithm")
