"""What a run collects its batches from: this rank's env handles and the collector the config describes.

The learner's process builds them (train/loop.py, assembly/context.py), and so does a producer process
(assembly/producer_process.py) for its own engine, so both collect exactly the same way.
"""

from __future__ import annotations

from horizonrl.algos.registry import Batches
from horizonrl.config import TrainConfig
from horizonrl.engines.base import Engine
from horizonrl.envs.pool import open_envs
from horizonrl.learner.distributed import Ranks
from horizonrl.rollout.collector import Collector
from horizonrl.rollout.episode_groups import EnvEpisodes, load_reward_fn
from horizonrl.rollout.fixed_turn import FixedTurnCollector
from horizonrl.rollout.from_config import make_agent, sampling_params
from horizonrl.rollout.groups import GroupCollector
from horizonrl.rollout.seat_opponents import NO_OPPONENT, SeatOpponent
from horizonrl.assembly.tasks import task_collector


def run_envs(cfg: TrainConfig, ranks: Ranks) -> list:
    """This rank's env handles, one per stream of its share of rollout.n_env (none for a task run)."""
    if cfg.task is not None:
        return []
    streams = ranks.share(cfg.rollout.n_env)
    return open_envs(cfg.env.ids, cfg.env.kwargs, len(streams), cfg.env.workers, cfg.env.timeout_s, streams.start)


def make_collector(cfg: TrainConfig, tokenizer, engine: Engine, model, envs: list, ranks: Ranks,
                   opponent: SeatOpponent = NO_OPPONENT) -> Collector:
    """This rank's collector: fixed-turn streams (ppo), the task's groups (`task`) or env episode groups, sampling
    from `engine` as the config says (`model`: the policy it samples, whose config and stop ids it reads;
    `opponent`: who plays a self-play game's other seat, `selfplay`)."""
    agent = make_agent(tokenizer, cfg.agent)
    params = sampling_params(cfg.rollout, tokenizer, model, agent)
    if cfg.algorithm_spec.batches is Batches.STREAMS:
        return FixedTurnCollector(envs, agent, engine, params, cfg.ppo.e_len, cfg.seed,
                                  ranks.share(cfg.rollout.n_env).start, cfg.rollout.n_env)
    if cfg.task is not None:
        return task_collector(cfg, tokenizer, engine, params, model.config.max_position_embeddings,
                              ranks.share(cfg.group.n_tasks))
    episodes = EnvEpisodes(envs, cfg.env.ids, agent, engine, params, cfg.group.max_turns,
                           load_reward_fn(cfg.group.reward_fn), opponent)
    return GroupCollector(episodes, cfg.group.n_tasks, cfg.group.group_size, cfg.seed, ranks.share(cfg.group.n_tasks))
