"""Episode groups for GRPO-style estimators: whole episodes, task x group_size, shared group ids."""

import pytest

from horizonrl.agents.agent import Agent
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.scripted import RandomFormatEngine
from horizonrl.envs.pool import open_envs
from horizonrl.rollout.episode_groups import EnvEpisodes, episode_return, load_reward_fn
from horizonrl.rollout.groups import GroupCollector


def collector_for(tokenizer, n_tasks, n_handles=2, max_turns=30, reward_fn=episode_return):
    handles = open_envs("river", {"stones": 2, "max_steps": 6}, n_handles, workers=False, timeout_s=10)
    engine = RandomFormatEngine(tokenizer, handles[0].actions, seed=0)
    episodes = EnvEpisodes(handles, ["river"], Agent(tokenizer), engine, SamplingParams(), max_turns=max_turns,
                           reward_fn=reward_fn)
    return GroupCollector(episodes, n_tasks=n_tasks, group_size=4, seed=1)


def test_groups_are_whole_episodes_from_one_seed(river_tiny):
    tokenizer, _ = river_tiny
    collector = collector_for(tokenizer, n_tasks=3)
    episodes = collector.collect()
    assert len(episodes) == 12 and not collector.errors
    for g in range(3):
        group = episodes[4 * g: 4 * g + 4]
        assert len({e.group_id for e in group}) == 1 and len({e.seed for e in group}) == 1
        assert len({e.turns[0].prompt_ids.__repr__() for e in group}) == 1     # same start state
        assert len({e.episode_id for e in group}) == 4
    for e in episodes:
        assert e.finished and e.outcome_reward == pytest.approx(sum(t.reward for t in e.turns))
        assert e.turns[-1].terminated or e.turns[-1].truncated
    assert collector.collect()[0].seed == episodes[-1].seed + 1      # the next batch, new tasks


def test_max_turns_truncates_and_reward_fn_sees_the_whole_episode(river_tiny):
    tokenizer, _ = river_tiny
    seen = []
    collector = collector_for(tokenizer, n_tasks=2, max_turns=2,
                              reward_fn=lambda e: seen.append(e) or len(e.turns) * 10.0)
    episodes = collector.collect()
    assert all(len(e.turns) <= 2 for e in episodes)
    assert all(e.turns[-1].truncated for e in episodes if not e.turns[-1].terminated)
    assert seen == episodes and all(e.outcome_reward == len(e.turns) * 10.0 for e in episodes)


def test_reward_fn_by_path():
    assert load_reward_fn(None) is episode_return
    assert load_reward_fn("horizonrl.rollout.episode_groups:episode_return") is episode_return
    with pytest.raises(ValueError, match="reward function 'nope:f' cannot be loaded"):
        load_reward_fn("nope:f")
