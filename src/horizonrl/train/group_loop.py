"""Critic-free training on episode groups: GRPO, Dr.GRPO, RLOO, REINFORCE++.

    collect n_tasks x group_size whole episodes  ->  outcome reward per episode (reward_fn)
    ->  per-turn rows scored by the actor (logp_old)  ->  group advantage, broadcast over every
    sampled token of the episode  ->  PPO-clipped actor update  ->  sync weights to the engine

Episodes closed by an env error are left out of their group. There is no KL-in-reward term here
(there is no per-token reward to put it in); `ppo.kl_loss_coef` puts the KL in the actor loss instead,
and `train/kl_ref` is logged.
"""

from __future__ import annotations

import time
from pathlib import Path

from tqdm import tqdm

from horizonrl.config import TrainConfig
from horizonrl.learner.update import Stats, minibatch_updates
from horizonrl.report.metrics import MetricsLog, episode_metrics
from horizonrl.report.trajectories import trajectory_records, write_trajectories
from horizonrl.train.batch import batch_metrics, group_advantages_to_tokens, prepare
from horizonrl.train.checkpoint import Checkpointer


def group_iterations(cfg: TrainConfig, collector, engine, actor, reference, actor_opt, actor_loss, pad_id: int,
                     shuffle, metrics_log: MetricsLog, device, progress: bool, tokenizer, run_dir: Path,
                     checkpointer: Checkpointer, first: int) -> None:
    """Iterations `first`..cfg.iterations. `collector`: an EpisodeGroupCollector (env) or a
    TaskGroupCollector (agent-loop task)."""
    ppo, group = cfg.ppo, cfg.group
    bar = tqdm(range(first, cfg.iterations + 1), desc=cfg.name, disable=not progress, dynamic_ncols=True)
    for iteration in bar:
        started = time.perf_counter()
        episodes = collector.collect(group.n_tasks)
        rollout_s = time.perf_counter() - started
        kept = [e for e in episodes if "error" not in e.metrics]
        batch = prepare(kept, actor, reference, None, pad_id, ppo.micro_batch_budget, cfg.rollout.temperature, device,
                        tokenizer=tokenizer, **cfg.sample_options(run_dir))
        group_advantages_to_tokens(batch, cfg.algorithm)
        score_s = time.perf_counter() - started - rollout_s

        started = time.perf_counter()
        actor_stats = Stats()
        minibatch_updates(batch.data, ppo.mini_batch_size, ppo.micro_batch_budget, ppo.epochs, shuffle,
                          [(actor_opt, actor_loss, ppo.grad_clip, actor_stats)])
        engine.sync_weights(actor)
        update_s = time.perf_counter() - started

        generated = sum(len(t.response_ids) for e in kept for t in e.turns)
        record = {"iteration": iteration, "phase": cfg.algorithm, "env/errors": len(collector.errors),
                  **episode_metrics(episodes), **actor_stats.means("train/actor/"), **batch_metrics(batch),
                  "train/outcome_reward_mean": sum(e.outcome_reward for e in kept) / max(len(kept), 1),
                  "perf/rollout_tokens_per_s": generated / rollout_s,
                  "perf/train_tokens_per_s": float(batch.data["attention_mask"].sum()) / (score_s + update_s),
                  "timing/rollout_s": rollout_s, "timing/score_s": score_s, "timing/update_s": update_s}
        metrics_log.write(record)
        write_trajectories(run_dir, trajectory_records(iteration, batch.episodes, batch.samples,
                                                       batch.data["advantages"], tokenizer))
        bar.set_postfix(success=f"{record['env/success_rate']:.2f}", ret=f"{record['env/episode_return']:.2f}")
        checkpointer.iteration_done(iteration)
