"""Expert demonstrations for the supervised warm start (`horizonrl sft`).

Whole episodes played by an env's expert (an env with `expert_action()`: BabyAI's bot, the BabaIsAI solver) through
the same agent and collector as training: every prompt is exactly the one the agent builds (memory
window, history mode, chat template), every response is the expert's action in the agent's
THINK/ACTION format with the expert's reason as THINK, parsed back by the agent like a model's.

With `noise` (sft.expert_noise, DART) some turns take a random action the expert recovers from instead: they are
not demonstrations (`demonstration_rows` masks them out), but the expert's turns after them show the way back
from states its own play never reaches, such as a policy's mistakes.
"""

from __future__ import annotations

from horizonrl.agents.agent import Agent
from horizonrl.config import ConfigError
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.scripted import ExpertEngine
from horizonrl.envs.pool import InProcessEnv
from horizonrl.records import Episode, SampleBatch
from horizonrl.rollout.episode_groups import EnvEpisodes
from horizonrl.rollout.groups import GroupCollector
from horizonrl.samples.per_turn import per_turn


def expert_episodes(agent: Agent, env_id: str, env_kwargs: dict, episodes: int, max_turns: int,
                    seed: int, noise: float = 0.0) -> list[Episode]:
    """`episodes` expert episodes, one after the other on one in-process env, from the episode-group
    collector's seeds for `seed`; with `noise`, each turn that took a random action instead has
    `info["deviation"]`."""
    handle = InProcessEnv(env_id, env_kwargs)
    try:
        if not hasattr(handle.env, "expert_action"):
            raise ConfigError(f"env.id: {env_id} has no expert to demonstrate it (no expert_action()); "
                              "docs/environments.md names the envs with one")
        if noise and not hasattr(handle.env, "expert_recovers_from"):
            raise ConfigError(f"sft.expert_noise: the expert of env.id {env_id} does not say which actions it "
                              "recovers from (no expert_recovers_from); set sft.expert_noise=0")
        engine = ExpertEngine(agent.tokenizer, handle, noise, seed)
        expert = EnvEpisodes([handle], [env_id], agent, engine, SamplingParams(stop_patterns=agent.stop_patterns),
                             max_turns=max_turns)
        demos = GroupCollector(expert, n_tasks=episodes, group_size=1, seed=seed).collect()
    finally:
        handle.close()
    for turn in (turn for episode in demos for turn in episode.turns):
        if (tuple(turn.prompt_ids), tuple(turn.response_ids)) in engine.deviations:
            turn.info["deviation"] = True
    return demos


def demonstration_rows(demos: list[Episode]) -> SampleBatch:
    """One row per turn (`per_turn`), the loss mask zero on the turns that deviated from the expert."""
    rows = per_turn(demos)
    turns = [turn for episode in demos for turn in episode.turns]   # per_turn's row order
    for mask, turn in zip(rows.loss_mask, turns, strict=True):
        if turn.info.get("deviation"):
            mask[:] = [0] * len(mask)
    return rows
