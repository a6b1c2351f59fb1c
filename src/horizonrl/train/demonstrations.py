"""Expert demonstrations for the supervised warm start (`horizonrl sft`).

Whole episodes played by an env's expert (an env with `expert_action()`: BabyAI's bot, the BabaIsAI solver) through
the same agent and collector as training: every prompt is exactly the one the agent builds (memory
window, history mode, chat template), every response is the expert's action in the agent's
THINK/ACTION format with the expert's reason as THINK, parsed back by the agent like a model's.
"""

from __future__ import annotations

from horizonrl.agents.agent import Agent
from horizonrl.config import ConfigError
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.scripted import ExpertEngine
from horizonrl.envs.pool import InProcessEnv
from horizonrl.records import Episode
from horizonrl.rollout.episode_groups import EnvEpisodes
from horizonrl.rollout.groups import GroupCollector


def expert_episodes(agent: Agent, env_id: str, env_kwargs: dict, episodes: int, max_turns: int,
                    seed: int) -> list[Episode]:
    """`episodes` expert episodes, one after the other on one in-process env, from the episode-group
    collector's seeds for `seed`."""
    handle = InProcessEnv(env_id, env_kwargs)
    try:
        if not hasattr(handle.env, "expert_action"):
            raise ConfigError(f"env.id: {env_id} has no expert to demonstrate it (no expert_action()); "
                              "docs/environments.md names the envs with one")
        expert = EnvEpisodes([handle], [env_id], agent, ExpertEngine(agent.tokenizer, handle),
                             SamplingParams(stop_patterns=agent.stop_patterns), max_turns=max_turns)
        collector = GroupCollector(expert, n_tasks=episodes, group_size=1, seed=seed)
        return collector.collect()
    finally:
        handle.close()
