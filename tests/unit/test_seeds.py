"""Held-out evaluation seeds are disjoint from every seed training uses."""

from pathlib import Path

import pytest

from horizonrl.agents.agent import Agent
from horizonrl.config import load_config
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.scripted import RandomFormatEngine
from horizonrl.envs.pool import open_envs
from horizonrl.rollout.episode_groups import EnvEpisodes
from horizonrl.rollout.groups import GroupCollector
from horizonrl.rollout.fixed_turn import FixedTurnCollector
from horizonrl.rollout.seeds import (HELD_OUT_COUNT, HELD_OUT_START, SEED_BLOCK, VALIDATION_COUNT, VALIDATION_START,
                                     first_training_seed, held_out_seeds, max_training_episodes, validation_seeds)

HELD_OUT = range(HELD_OUT_START, HELD_OUT_START + HELD_OUT_COUNT)
RECIPES = Path(__file__).resolve().parents[2] / "configs"


def overlaps(a: range, b: range) -> bool:
    return a.start < b.stop and b.start < a.stop


def test_held_out_seeds_are_one_fixed_range():
    assert held_out_seeds(3) == [HELD_OUT_START, HELD_OUT_START + 1, HELD_OUT_START + 2]
    assert held_out_seeds(HELD_OUT_COUNT)[-1] == HELD_OUT.stop - 1
    for n in (0, HELD_OUT_COUNT + 1):
        with pytest.raises(ValueError, match="episodes must be between 1 and"):
            held_out_seeds(n)


def test_validation_seeds_meet_neither_the_held_out_range_nor_a_training_seed():
    """Validation seeds lie above the held-out range, within block 0 (below SEED_BLOCK, where block 1 starts),
    at offsets j >= HELD_OUT_START that no evaluable run trains on (`check_evaluable` refuses the others)."""
    validation = range(VALIDATION_START, VALIDATION_START + VALIDATION_COUNT)
    assert validation_seeds(2) == [600_100, 600_101] and validation_seeds(VALIDATION_COUNT)[-1] == validation.stop - 1
    assert not overlaps(validation, HELD_OUT) and HELD_OUT_START <= validation.start and validation.stop <= SEED_BLOCK
    for s in range(20_000):   # the tokenizer corpus seeds
        assert not overlaps(range(s * 100_003, s * 100_003 + 64), validation), s
    for n in (0, VALIDATION_COUNT + 1):
        with pytest.raises(ValueError, match="validation episodes must be between 1 and"):
            validation_seeds(n)


def test_the_training_rule_never_meets_the_held_out_range():
    """Collector seeds r * SEED_BLOCK + j, j < HELD_OUT_START, for every run seed r (and r + 7919 of the
    warm start) below 20_000; and the tokenizer corpus seeds s * 100_003 + e, e < 64."""
    for r in range(20_000 + 7919):
        start = first_training_seed(r)
        assert not overlaps(range(start, start + HELD_OUT_START), HELD_OUT), r
    for s in range(20_000):
        assert not overlaps(range(s * 100_003, s * 100_003 + 64), HELD_OUT), s


@pytest.mark.parametrize("run_seed", [0, 1, 3])
def test_collectors_follow_the_training_rule(river_tiny, run_seed):
    tokenizer, _ = river_tiny
    envs = open_envs("river", {"stones": 2, "max_steps": 3}, 3, workers=False, timeout_s=10)
    engine = RandomFormatEngine(tokenizer, envs[0].actions, seed=0)
    fixed = FixedTurnCollector(envs, Agent(tokenizer), engine, SamplingParams(), e_len=4, seed=run_seed)
    groups = GroupCollector(EnvEpisodes(envs, ["river"], Agent(tokenizer), engine, SamplingParams(), max_turns=3),
                            n_tasks=4, group_size=2, seed=run_seed)
    fixed_seeds = {e.seed for _ in range(3) for e in fixed.collect()}
    group_seeds = {e.seed for _ in range(2) for e in groups.collect()}
    start = first_training_seed(run_seed)
    assert start == run_seed * SEED_BLOCK
    assert min(fixed_seeds) == start and max(fixed_seeds) < start + 3 * 4 * 3      # streams x turns x batches
    assert group_seeds == set(range(start, start + 8))
    assert not (fixed_seeds | group_seeds) & set(HELD_OUT)


@pytest.mark.parametrize("recipe", sorted(p.name for p in RECIPES.glob("*.yaml")))
def test_every_recipe_trains_below_the_held_out_range(recipe):
    assert max_training_episodes(load_config(RECIPES / recipe, runs_here=False)) <= HELD_OUT_START   # vLLM: not here
