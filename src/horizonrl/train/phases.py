"""The phases every iteration runs, whatever its family (train/ppo.py, train/group.py): score the rows with the
networks a term reads (`needed_scores`), sync the weights to the engine, and record the iteration.

The family modules call these through this module (`phases.score(...)`), so a test that replaces one replaces it
for every family.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from horizonrl.config import TrainConfig
from horizonrl.learner.distributed import LOCAL, Ranks
from horizonrl.learner.lora import merged_parameters
from horizonrl.learner.update import single_optimizer_step
from horizonrl.records import Episode
from horizonrl.report.metrics import episode_metrics
from horizonrl.report.trajectories import trajectory_records, write_trajectories
from horizonrl.rollout.producer import Producer
from horizonrl.samples.split_advice import split_advice
from horizonrl.train.batch import PPOBatch, batch_metrics, prepare, score_batch
from horizonrl.assembly.context import RunContext
from horizonrl.assembly.producer_process import ProducerProcess

log = logging.getLogger(__name__)


def score(ctx: RunContext, episodes: list[Episode], critic, updates_actor: bool = True) -> PPOBatch:
    """The episodes' rows (per-turn or merged, as the config says) scored by `critic` (None: no values) and
    by the actor and the reference where `needed_scores` says (`updates_actor`: the batch trains the actor)."""
    cfg = ctx.cfg
    batch = prepare(episodes, ctx.pad_id, ctx.device, tokenizer=ctx.tokenizer,
                    weights_version=ctx.engine.weights_version, **cfg.sample_options(ctx.run_dir))
    n_rows = len(batch.rows) if updates_actor else None
    old, ref = needed_scores(cfg, n_rows, ctx.ranks)
    score_batch(batch, ctx.pad_id, ctx.micro_batch_budget, cfg.rollout.temperature,
                actor=ctx.actor if old else None, reference=ctx.reference if ref else None, critic=critic,
                ranks=ctx.ranks, sharing=ctx.sharing)
    return batch


def needed_scores(cfg: TrainConfig, n_rows: int | None, ranks: Ranks = LOCAL) -> tuple[bool, bool]:
    """(logp_old, logp_ref): whether a term of the iteration reads the actor's, and the reference's, log-probs
    of a batch of `n_rows` rows (on this rank; None: a batch that trains no actor, the critic warmup's).

    The KL in the reward (an algorithm with a critic, ppo.kl_coef > 0) reads both. The actor loss reads logp_ref with
    actor.kl_loss_coef > 0, and logp_old unless the update is one optimizer step: then the update's own
    forward, detached, is the old policy (learner/update.py actor_loss_fn), as in TRL's GRPOTrainer."""
    kl_in_reward = cfg.algorithm_spec.critic and cfg.ppo.kl_coef > 0
    if n_rows is None:
        return kl_in_reward, kl_in_reward
    one_step = single_optimizer_step(n_rows, cfg.optim.mini_batch_size, cfg.optim.epochs, ranks)
    return kl_in_reward or not one_step, kl_in_reward or cfg.actor.kl_loss_coef > 0


def sync_engine(ctx: RunContext) -> dict[str, float]:
    """The engine samples from the updated actor: its own module, or a copy refreshed one whole
    tensor at a time from the actor's shards (every rank gathers, in the same order). Returns the served-policy
    check's metrics (assembly/sync_check.py: EngineOutOfSync when the engine did not take the weights)."""
    ctx.engine.sync_weights(ctx.actor, merged_parameters(ctx.actor))
    return ctx.sync_check.after_sync(ctx.engine, ctx.actor)


@dataclass
class Iteration:
    """What an iteration gives the loop: its metrics record and the batch it trained on (its sample episodes go
    to trajectories.jsonl). The loop adds the run's progress and writes both (`write_records`)."""

    record: dict
    batch: PPOBatch


def iteration_record(ctx: RunContext, i: int, phase: str, episodes: list[Episode], batch: PPOBatch,
                     timings: dict[str, float], update_stats: dict[str, float]) -> Iteration:
    """The iteration's record: env statistics of every collected episode, the collector's counts (the
    gateway's, `gateway/*`), the update's statistics (with the KL to the reference and the sampler's
    consistency), the batch's (data, critic fit), throughput and timings; every rank's, reduced from each
    rank's sums and counts (no episode or row crosses the ranks). With optim.shared_prefix,
    `perf/shared_prefix_share`: the share of the learner's row tokens (scoring and update) computed once for rows
    that share them. `timing/rollout_s` is how long the batch took
    to play: the learner's wait for it, or with a producer (rollout.async_training) the producer's time from the
    batch's start to its delivery, the learner's wait being `async/learner_wait_s`."""
    counts = ctx.collector.counts
    producer = ctx.collector if isinstance(ctx.collector, (Producer, ProducerProcess)) else None
    if producer is not None:      # the batch was played ahead: its time is the producer's, not the learner's wait
        timings = {**timings, "timing/rollout_s": producer.taken.played_s}
    generated, trained, errors, *counted = ctx.ranks.sum([
        sum(len(t.response_ids) for e in batch.episodes for t in e.turns), float(batch.rows.attention_mask.sum()),
        len(ctx.collector.errors), *counts.values()])
    record = {"iteration": i, "phase": phase, "env/errors": int(errors), **dict(zip(counts, map(int, counted))),
              **episode_metrics(episodes, ctx.ranks), **update_stats,
              **batch_metrics(batch, ctx.ranks),
              "perf/rollout_tokens_per_s": generated / timings["timing/rollout_s"],
              "perf/train_tokens_per_s": trained / (timings["timing/score_s"] + timings["timing/update_s"]),
              **timings}
    if producer is not None:
        record.update(producer.metrics(ctx.ranks))
    if ctx.sharing.bodies():        # optim.shared_prefix: the learner's row tokens a shared prefix's pass stood for
        tokens, skipped = ctx.ranks.sum([sum(counts) for counts in zip(*(s.taken() for s in ctx.sharing.bodies()))])
        record["perf/shared_prefix_share"] = skipped / max(tokens, 1)
    explain_splits(ctx, record)
    return Iteration(record, batch)


def explain_splits(ctx: RunContext, record: dict) -> None:
    """Once per run (rank 0 logs it): why most of the turns of the iteration of `record` that could have merged
    split, when they did (samples/split_advice.py). Every rank sees the same record, so agrees."""
    if ctx.splits_explained or "data/merge/turns" not in record:
        return
    advice = split_advice(record)
    if advice is not None:
        ctx.splits_explained = True
        if ctx.ranks.is_main:
            log.warning(advice)


def write_records(ctx: RunContext, done: Iteration) -> None:
    """The iteration's record to every metrics sink, two sample episodes of its batch to trajectories.jsonl
    (rank 0's)."""
    if not ctx.ranks.is_main:
        return
    ctx.metrics.write(done.record)
    batch = done.batch
    write_trajectories(ctx.run_dir, trajectory_records(done.record["iteration"], batch.episodes, batch.samples,
                                                       batch.rows.advantages, ctx.tokenizer))


class Stopwatch:
    """`lap(name)` records the seconds since the previous lap (or the start) as laps["timing/<name>_s"]."""

    def __init__(self):
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[f"timing/{name}_s"] = now - self._last
        self._last = now
