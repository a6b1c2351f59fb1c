"""One iteration's training data: rows, network scores, token rewards, advantages.

`PPOBatch.rows` (samples/tensors.py Rows, every tensor [R, T]):
    input_ids, attention_mask, loss_mask      from the samples (prepare)
    logp_engine                               the engine's log-probs (when every turn has them)
    sampled_by_current                        1 on the tokens of turns the weights being trained sampled (when
                                              every turn has its weights version and `prepare` is given it)
    logp_old, entropy, logp_ref, values_old   from the networks score_batch is given (the others stay None)
    advantages, returns                       from the family's advantages (train/ppo.py, train/group.py)
`bootstrap_values` [B] holds V(s_{T+1}) of each bootstrap prompt (empty without a critic).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from horizonrl.algos.losses import explained_variance
from horizonrl.config import MergeConfig, MicroBatchBudget
from horizonrl.learner.distributed import LOCAL, Ranks
from horizonrl.learner.scoring import prompt_values, score
from horizonrl.learner.shared_prefix import UNSHARED, NetworkSharing
from horizonrl.records import Episode, SampleBatch
from horizonrl.rollout.failures import raise_if_none_succeeded
from horizonrl.samples.merge import MergeReport, merge_turns, write_mismatches
from horizonrl.samples.per_turn import per_turn
from horizonrl.samples.tensors import Rows, TurnIndex


@dataclass
class PPOBatch:
    episodes: list[Episode]
    samples: SampleBatch
    index: TurnIndex
    rows: Rows
    bootstrap_values: Tensor
    merge_report: MergeReport | None = None


def build_samples(episodes: list[Episode], merge: MergeConfig | None, tokenizer=None
                  ) -> tuple[SampleBatch, MergeReport | None]:
    """Per-turn rows (merge None), or prefix-merged rows and the report of what merged and why not."""
    if merge is None:
        return per_turn(episodes), None
    return merge_turns(episodes, merge.max_prompt_len, merge.max_response_len, tokenizer)


def prepare(episodes: list[Episode], pad_id: int, device, merge: MergeConfig | None = None, tokenizer=None,
            mismatch_log: Path | None = None, weights_version: int | None = None) -> PPOBatch:
    """Rows of `episodes` (see build_samples), not scored yet. With `mismatch_log`, every prefix mismatch is
    appended to it as a JSON line. `weights_version`: the engine's now, that of the policy the batch trains
    (asynchronous training samples turns with older ones)."""
    samples, merge_report = build_samples(episodes, merge, tokenizer)
    if merge_report is not None and mismatch_log is not None:
        write_mismatches(merge_report, mismatch_log)
    rows = Rows.of(samples, pad_id, device)
    index = TurnIndex.of(samples, device)
    turns = [t for e in episodes for t in e.turns]                # in the segments' order
    if turns and all(t.response_logprobs is not None for t in turns):
        rows = dataclasses.replace(rows, logp_engine=index.to_rows(
            turn_layout([t.response_logprobs for t in turns], index.mask), rows.input_ids.shape))
    if turns and weights_version is not None and all("weights_version" in t.info for t in turns):
        current = [[float(t.info["weights_version"] == weights_version)] * len(t.response_ids) for t in turns]
        rows = dataclasses.replace(rows, sampled_by_current=index.to_rows(turn_layout(current, index.mask),
                                                                          rows.input_ids.shape))
    return PPOBatch(episodes, samples, index, rows, torch.zeros(0, device=device), merge_report)


def score_batch(batch: PPOBatch, pad_id: int, budget: MicroBatchBudget, temperature: float = 1.0, actor=None,
                reference=None, critic=None, ranks: Ranks = LOCAL, sharing: NetworkSharing = UNSHARED) -> None:
    """Score the rows with the networks given (learner.scoring.score; a network given again replaces its
    scores, each sharing prefixes as `sharing` says) and, with a critic, the bootstrap prompts. Across ranks, each
    scores its own rows (in as many forward passes as the others)."""
    scores = score(batch.rows, budget, temperature, actor=actor, reference=reference, critic=critic, ranks=ranks,
                   sharing=sharing)
    batch.rows = dataclasses.replace(batch.rows, **scores.given())
    if critic is not None:
        batch.bootstrap_values = prompt_values(critic, batch.samples.bootstrap_prompts, pad_id, budget,
                                               batch.rows.input_ids.device, ranks, sharing.critic)


def kept_episodes(episodes: list[Episode], ranks: Ranks = LOCAL) -> list[Episode]:
    """The episodes of a group batch that train: those not dropped (an env error or a failed agent put
    "error" in their metrics). Every rank must bring rows to the update's collectives, so when some rank
    kept none, every rank raises the same RolloutsFailed naming how many episodes each rank dropped and the
    failures that dropped them, the most common first (`raise_if_none_succeeded`)."""
    kept = [e for e in episodes if "error" not in e.metrics]
    raise_if_none_succeeded(len(kept), len(episodes), [e.metrics["error"] for e in episodes if "error" in e.metrics],
                            "episode of the batch", "the update has no rows to train on", ranks)
    return kept


def played_episodes(episodes: list[Episode], n_turns: int, errors: list[str], ranks: Ranks = LOCAL) -> list[Episode]:
    """The fragments of a fixed-turn batch of `n_turns` turns on this rank, every one of which trains (an env
    error closes its episode, keeping the turns before it). When some rank played no turn (every env step
    failed, `errors`), every rank raises the same RolloutsFailed naming the errors (`raise_if_none_succeeded`)."""
    raise_if_none_succeeded(sum(len(e.turns) for e in episodes), n_turns, errors, "env step of the batch",
                            "the update has no rows to train on", ranks)
    return episodes


def turn_layout(values: list[list[float]], mask: Tensor) -> Tensor:
    """Per-token values of each turn's response as an [N, L] tensor like `mask` (a turn's first
    mask.sum() values; zero beyond)."""
    out = torch.zeros_like(mask)
    for n, turn_values in enumerate(values):
        length = int(mask[n].sum())
        out[n, :length] = torch.tensor(turn_values[:length], dtype=out.dtype)
    return out


def sampled_tokens(batches: list[PPOBatch], field: str) -> Tensor:
    """Rows' `field` at the sampled tokens of every batch (this rank's), one flat tensor."""
    return torch.cat([getattr(b.rows, field)[b.rows.loss_mask.bool()] for b in batches])


def batch_metrics(batch: PPOBatch, ranks: Ranks = LOCAL) -> dict[str, float]:
    """Data and critic-fit statistics of a prepared batch, over every rank's rows, from each rank's sums and
    counts (no row crosses the ranks). (The statistics of the learner's old log-probs, KL to the reference
    and the sampler's consistency, come from the actor update: learner/update.py actor_loss_fn.)"""
    data = batch.rows
    sampled = data.loss_mask.bool()
    n, returns_sum, attended, rows, bootstrap_prompts = ranks.sum([
        float(sampled.sum()), float(data.returns[sampled].sum()), float(data.attention_mask.sum()),
        float(len(data)), float(len(batch.samples.bootstrap_prompts))])
    metrics = {
        "data/mask_ones_ratio": n / attended,
        "data/rows": int(rows),
        "data/bootstrap_prompts": int(bootstrap_prompts),
        "train/returns_mean": returns_sum / n,
    }
    if batch.merge_report is not None:
        report = batch.merge_report.as_metrics()
        metrics.update(zip(report, map(int, ranks.sum(list(report.values())))))
    if data.values_old is not None:
        metrics["train/critic/explained_variance"] = explained_variance(data.values_old, data.returns,
                                                                        data.loss_mask, total=ranks.sum)
    return metrics
