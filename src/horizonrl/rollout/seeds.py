"""Which env seeds episodes start from: the training rule and the held-out evaluation range.

Training. A collector built with seed r starts at `first_training_seed(r) = r * SEED_BLOCK` and counts
up: stream i of the fixed-turn collector's n plays r*B + i, r*B + i + n, r*B + i + 2n, ...; the
episode-group and task-group collectors play r*B, r*B + 1, ..., one seed per task. A run with seed s
collects with r = s (PPO batches, critic warmup, episode groups) and, for the tiny model's format
warm start, r = s + 7919. So every seed a run trains on is r*B + j with 0 <= j < the number of
episodes that collector started. (The tiny model's BPE tokenizer also reads random-play text from
seeds s * 100_003 + e, e < 64: see assembly/warm_start.env_corpus.)

Held out. Evaluation plays seeds HELD_OUT_START + i, i < HELD_OUT_COUNT, i.e. [500_100, 600_000).
They lie in block 0 at offsets >= 500_100, so r*B + j is one of them only if r = 0 and j >= 500_100:
no run whose collectors each started at most HELD_OUT_START episodes (`max_training_episodes`) ever
trained on one. Verlog's BabyAI run starts at most 32 x 8 x (300 + 40) = 87_040. The tokenizer's
seeds near the range, 500_015..500_078 and 600_018..600_081, fall outside it.

Validation. A run's validation (train/validation.py, which picks the policy a run keeps) plays seeds
VALIDATION_START + i, i < VALIDATION_COUNT, i.e. [600_100, 700_000): above the held-out range, in block 0 at
offsets no run that may be evaluated trains on (so what validation selects is not fitted to the held-out
seeds), between the tokenizer's seeds 600_018..600_081 and 700_021..700_084.
"""

from __future__ import annotations

from horizonrl.algos.registry import Batches
from horizonrl.config import TrainConfig

SEED_BLOCK = 1_000_003
HELD_OUT_START = 500_100
HELD_OUT_COUNT = 99_900
VALIDATION_START = 600_100
VALIDATION_COUNT = 99_900


def first_training_seed(seed: int) -> int:
    """The first env seed of a training collector built with `seed`; it counts up from here."""
    return seed * SEED_BLOCK


def held_out_seeds(n: int) -> list[int]:
    """The first `n` held-out seeds (the same for every run, so evaluations compare like with like)."""
    if not 0 < n <= HELD_OUT_COUNT:
        raise ValueError(f"episodes must be between 1 and {HELD_OUT_COUNT}, got {n}")
    return list(range(HELD_OUT_START, HELD_OUT_START + n))


def validation_seeds(n: int) -> list[int]:
    """The first `n` validation seeds."""
    if not 0 < n <= VALIDATION_COUNT:
        raise ValueError(f"validation episodes must be between 1 and {VALIDATION_COUNT}, got {n}")
    return list(range(VALIDATION_START, VALIDATION_START + n))


def max_training_episodes(cfg: TrainConfig) -> int:
    """An upper bound on the episodes any one collector of the run `cfg` started (hence on its seed
    offsets j): every episode takes at least one turn of a fixed-turn batch, or is one task of a group
    batch (a group's rollouts share their seed)."""
    warm_start = cfg.rollout.n_env * cfg.model.warm_start.turns * cfg.model.warm_start.iterations \
        if cfg.model.warm_start else 0
    if cfg.algorithm_spec.batches is Batches.STREAMS:
        training = cfg.rollout.n_env * cfg.ppo.e_len * (cfg.critic.warmup_batches + cfg.iterations)
    else:
        training = cfg.group.n_tasks * cfg.iterations
    return max(warm_start, training)
