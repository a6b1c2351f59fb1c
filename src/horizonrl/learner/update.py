"""Optimizer steps for the actor and the critic: mini-batches, micro-batch gradient accumulation,
gradient clipping, a retry with half the micro-batch budget after running out of memory.

Every micro-batch loss is normalised by its mini-batch's token and row counts (see
`algos.losses.aggregate`), never by its own, so the accumulated gradient equals the full mini-batch
gradient however the rows are packed into micro-batches (by rows or by a token budget), for every
loss aggregation mode.

Across ranks (torchrun), a mini-batch is every rank's share of it: `mini_batch_size / world_size`
rows of each rank's own rows, normalised by the token and row counts summed over the ranks, and the
FSDP2 gradients are summed over the ranks, so one step equals the step of one process on the union of
the rows. Every rank runs as many mini-batches and micro-batches as the rank with the most, padding
with empty ones (see samples.tensors.Rows.empty); the statistics are summed over the ranks.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from horizonrl.algos.kl import kl_estimate
from horizonrl.algos.losses import (aggregate, approx_kl, first_token_weights, ppo_policy_loss, tis_weights,
                                    value_loss)
from horizonrl.config import MicroBatchBudget
from horizonrl.learner.distributed import LOCAL, Ranks, clip_grad_norm
from horizonrl.learner.scoring import micro_batches, padded_groups, token_logprobs, token_values
from horizonrl.learner.shared_prefix import Plan, Sharing
from horizonrl.samples.tensors import Rows

log = logging.getLogger(__name__)



class LossFn(Protocol):
    """A network's loss on a micro-batch `mb` of its mini-batch (normalised by the mini-batch's `num_tokens` and
    `num_seqs`), its forward run as the micro-batch's Plan says (`micro_batch`; None: planned from its rows), and
    its statistics as (sum, count) pairs on the device (`token_total`)."""

    def __call__(self, mb: Rows, num_tokens: float, num_seqs: float, micro_batch: Plan | None = None
                 ) -> tuple[Tensor, dict[str, tuple[Tensor, Tensor]]]: ...


class Stats:
    """Running (sum, count) pairs reported as means: per token for token statistics, per optimizer
    step for `loss` and `grad_norm`. A statistic added with count 0 is a counter, reported as its sum."""

    def __init__(self):
        self.sums: dict[str, float] = defaultdict(float)
        self.counts: dict[str, float] = defaultdict(float)

    def add(self, name: str, total: float, count: float = 1.0) -> None:
        self.sums[name] += total
        self.counts[name] += count

    def means(self, prefix: str) -> dict[str, float]:
        """Each statistic under prefix + its name; a name with a "/" is already a whole metric name (e.g.
        `rollout/logprob_abs_diff`, measured in the actor update) and goes out as it is."""
        return {(k if "/" in k else f"{prefix}{k}"): s / self.counts[k] if self.counts[k] else s
                for k, s in self.sums.items()}

    def merge(self, other: Stats) -> None:
        for name, total in other.sums.items():
            self.add(name, total, other.counts[name])

    def summed(self, ranks: Ranks) -> Stats:
        """These statistics summed over the ranks (every rank must hold the same names)."""
        names = sorted(self.sums)
        values = ranks.sum([self.sums[n] for n in names] + [self.counts[n] for n in names])
        out = Stats()
        for k, name in enumerate(names):
            out.add(name, values[k], values[len(names) + k])
        return out


def is_out_of_memory(error: BaseException) -> bool:
    """torch.OutOfMemoryError, or a RuntimeError saying "out of memory" (CPU allocators, older torch)."""
    return isinstance(error, torch.OutOfMemoryError) or (isinstance(error, RuntimeError)
                                                         and "out of memory" in str(error))


def accumulate_gradients(optimizer, batches: Iterable[tuple[Rows | None, Plan | None]], loss_fn: LossFn,
                         num_tokens: float, num_seqs: float, data: Rows) -> tuple[float, Stats]:
    """Zero the gradients, then backward every micro-batch's loss (None: `data.empty()`, whose loss counts
    zero), its forward run as its Plan says (None: the empty one's own);
    returns the summed loss and the loss function's statistics.
    Losses and statistics stay on the device until the last micro-batch and cross to the host in one
    transfer: a GPU never waits for the host inside the loop."""
    optimizer.zero_grad(set_to_none=True)
    losses, parts_of = [], defaultdict(list)
    for mb, micro_batch in batches:
        empty = mb is None
        loss, parts = loss_fn(data.empty() if empty else mb, num_tokens, num_seqs, micro_batch)
        if empty:
            loss = loss * 0.0
        loss.backward()
        losses.append(loss.detach())
        for name, (total, count) in parts.items():
            parts_of[name].append((torch.zeros_like(total), torch.zeros_like(count)) if empty else (total, count))
    names = sorted(parts_of)
    sums = [torch.stack(losses).double().sum()] + [torch.stack([pair[k] for pair in parts_of[name]]).double().sum()
                                                  for k in (0, 1) for name in names]
    values = torch.stack(sums).tolist()
    stats = Stats()
    for i, name in enumerate(names):
        stats.add(name, values[1 + i], values[1 + len(names) + i])
    return values[0], stats


@dataclass
class UpdateStep:
    """What one network's optimizer step on a mini-batch needs: its optimizer, its loss, the gradient norm it is
    clipped to, and the statistics the step adds to."""

    optimizer: torch.optim.Optimizer
    loss_fn: LossFn
    grad_clip: float
    stats: Stats


def optimizer_step(update: UpdateStep, data: Rows, rows: list[int], budget: MicroBatchBudget, num_tokens: float,
                   num_seqs: float, ranks: Ranks = LOCAL) -> MicroBatchBudget:
    """`update`'s optimizer step over the mini-batch `rows` of `data`, in micro-batches within `budget`.

    `padding_share` (of the token slots the micro-batches compute, the padding: each micro-batch is as wide as its
    longest row, or, sharing prefixes, as its Plan's two passes) tells how well they are packed.
    Out of memory in a micro-batch: the step starts again from zero gradients with the budget halved
    (counted in `oom_retries`); out of memory again is an error, and so is the first one across ranks
    (the other ranks would wait in a collective). Skips (and counts in `skipped_updates`) the step
    when the loss or the gradient norm is not finite. Returns the budget the step ran with.
    """
    for retry in (False, True):
        try:
            packed = micro_batches(data, rows, budget)
            loss_total, step_stats = accumulate_gradients(
                update.optimizer, ((data.select(group) if group is not None else None, micro_batch)
                            for group, micro_batch in padded_groups(packed, ranks, (None, None))),
                update.loss_fn, num_tokens, num_seqs, data)
            break
        except RuntimeError as error:
            if not is_out_of_memory(error):
                raise
            if retry or ranks.distributed:
                raise RuntimeError(f"out of memory in a micro-batch with the budget {budget}; lower "
                                   "optim.max_tokens_per_micro_batch (or optim.micro_batch_size)") from error
        # outside the except block, so that the failed attempt's tensors are freed
        update.optimizer.zero_grad(set_to_none=True)
        halved = budget.halved()
        log.warning("out of memory in a micro-batch with %s: retrying the step with %s", budget, halved)
        budget = halved
    slots = sum(micro_batch.slots() for _, micro_batch in packed)
    step_stats.add("padding_share", slots - sum(micro_batch.computed() for _, micro_batch in packed), slots)
    stats = update.stats
    stats.merge(step_stats.summed(ranks))
    stats.add("oom_retries", float(retry), 0.0)
    params = [p for group in update.optimizer.param_groups for p in group["params"]]
    grad_norm = clip_grad_norm(params, update.grad_clip)
    loss_total = ranks.sum([loss_total])[0]
    finite = math.isfinite(loss_total) and math.isfinite(grad_norm)
    if finite:
        update.optimizer.step()
        stats.add("loss", loss_total)
        stats.add("grad_norm", grad_norm)
    else:
        log.warning("non-finite loss (%s) or gradient norm (%s): update skipped", loss_total, grad_norm)
        update.optimizer.zero_grad(set_to_none=True)
    stats.add("skipped_updates", float(not finite), 0.0)
    return budget


def token_total(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(sum of `x` over the sampled tokens, their count), on the device: a statistic that Stats reports per
    token (accumulate_gradients brings it to the host)."""
    return (x * mask).sum(), mask.sum()


def critic_loss_fn(critic, value_clip: float | None, first_token_weight: float, sharing: Sharing | None = None
                   ) -> LossFn:
    """Clipped value loss, token-mean over the mini-batch, first token of each turn weighted; the critic's forward
    shares prefixes with `sharing`."""
    def loss_fn(mb, num_tokens, num_seqs, micro_batch=None):
        mask = mb.loss_mask
        values = token_values(critic, mb.input_ids, mb.attention_mask, mask, sharing, micro_batch)
        per_token, clipped = value_loss(values, mb.values_old, mb.returns, value_clip)
        weights = first_token_weights(mask, first_token_weight)
        loss = aggregate(per_token * weights, mask, "token-mean", num_tokens=num_tokens)
        with torch.no_grad():
            parts = {"value_loss": token_total(per_token * weights, mask),
                     "value_clipfrac": token_total(clipped, mask),
                     "value_mse": token_total((values - mb.returns) ** 2, mask)}
        return loss, parts
    return loss_fn


def actor_loss_fn(actor, clip_low: float, clip_high: float, dual_clip: float | None, entropy_coef: float,
                  loss_agg: str, temperature: float, kl_loss_coef: float = 0.0, tis_cap: float | None = None,
                  tis_mode: str = "truncate", sharing: Sharing | None = None) -> LossFn:
    """PPO clipped surrogate (each token's term weighted by `tis_weights` when `tis_cap` is set, `tis_mode`)
    - entropy_coef * entropy + kl_loss_coef * k3 KL(pi || pi_ref) (GRPO's beta term, differentiated
    through pi), each aggregated by `loss_agg`; the actor's forward shares prefixes with `sharing`.

    logp_old: the micro-batch's scored log-probs, or, when it has none (phases.needed_scores did not score the
    actor), this forward's own, detached. That is exact only in an update of one optimizer step
    (`single_optimizer_step`): before its step the policy is the old one, so rho = 1 and the TIS weights are
    min(exp(logp - logp_engine), cap).

    Besides the loss terms, statistics of logp_old, so that they exist whether it was scored or not:
    `train/kl_ref` (k3 KL(pi_old || pi_ref), when there is a logp_ref) and the sampler's consistency,
    `rollout/logprob_abs_diff` = |logp_old - logp_engine| (and, with `tis_cap`, the mean TIS weight and
    the fraction of tokens over the cap, truncated or masked), when there is a logp_engine; with
    `sampled_by_current`, the share of tokens the weights being trained sampled and their own gap,
    `rollout/logprob_abs_diff_current` (float rounding only, where the engine holds those weights; the
    served-policy check, assembly/sync_check.py, scores probe rows of its own instead, at every staleness)."""
    def loss_fn(mb, num_tokens, num_seqs, micro_batch=None):
        mask = mb.loss_mask
        logp, entropy = token_logprobs(actor, mb.input_ids, mb.attention_mask, mask, temperature, sharing=sharing,
                                       micro_batch=micro_batch)
        logp_old = logp.detach() if mb.logp_old is None else mb.logp_old
        pg, clipped = ppo_policy_loss(logp, logp_old, mb.advantages, clip_low, clip_high, dual_clip)
        if tis_cap is not None:
            if mb.logp_engine is None:
                raise ValueError("actor.tis_cap weights tokens by the engine's log-probs, and this engine returns none")
            weights = tis_weights(logp_old, mb.logp_engine, tis_cap, tis_mode)
            pg = pg * weights
        loss = aggregate(pg, mask, loss_agg, num_tokens, num_seqs)
        loss = loss - entropy_coef * aggregate(entropy, mask, loss_agg, num_tokens, num_seqs)
        if kl_loss_coef:
            kl = kl_estimate(logp, mb.logp_ref, "k3")
            loss = loss + kl_loss_coef * aggregate(kl, mask, loss_agg, num_tokens, num_seqs)
        with torch.no_grad():
            parts = {"pg_loss": token_total(pg, mask), "clipfrac": token_total(clipped, mask),
                     "approx_kl": token_total(approx_kl(logp, logp_old), mask), "entropy": token_total(entropy, mask)}
            if kl_loss_coef:
                parts["kl_loss"] = token_total(kl, mask)
            if mb.logp_ref is not None:
                parts["train/kl_ref"] = token_total(kl_estimate(logp_old, mb.logp_ref, "k3"), mask)
            if mb.logp_engine is not None:
                gap = logp_old - mb.logp_engine
                parts["rollout/logprob_abs_diff"] = token_total(gap.abs(), mask)
                if mb.sampled_by_current is not None:        # the tokens of the weights being trained: rounding only
                    current = mask * mb.sampled_by_current
                    parts["rollout/current_weights_frac"] = token_total(mb.sampled_by_current, mask)
                    parts["rollout/logprob_abs_diff_current"] = token_total(gap.abs(), current)
                if tis_cap is not None:
                    parts["rollout/tis_weight_mean"] = token_total(weights, mask)
                    parts["rollout/tis_clipped_frac"] = token_total((gap > math.log(tis_cap)).float(), mask)
        return loss, parts
    return loss_fn


def rows_per_step(mini_batch_size: int, ranks: Ranks = LOCAL) -> int:
    """This rank's share of a mini-batch: mini_batch_size / world_size rows (at least one)."""
    return max(1, mini_batch_size // ranks.world_size)


def optimizer_steps_per_epoch(n_rows: int, mini_batch_size: int, ranks: Ranks = LOCAL) -> int:
    """The mini-batches of this rank's `n_rows` rows: as many as the rank with the most has."""
    return ranks.max(math.ceil(n_rows / rows_per_step(mini_batch_size, ranks)))


def single_optimizer_step(n_rows: int, mini_batch_size: int, epochs: int, ranks: Ranks = LOCAL) -> bool:
    """Whether `minibatch_updates` of a batch of `n_rows` rows (on this rank) takes one optimizer step per
    network: one epoch of one mini-batch, on every rank."""
    return epochs == 1 and optimizer_steps_per_epoch(n_rows, mini_batch_size, ranks) == 1


def minibatch_updates(data: Rows, mini_batch_size: int, budget: MicroBatchBudget, epochs: int,
                      generator: torch.Generator, steps: list[UpdateStep], ranks: Ranks = LOCAL) -> None:
    """For each epoch, shuffle this rank's rows, cut them into mini-batches of mini_batch_size /
    world_size rows and run every one of `steps` on each mini-batch, as many as the rank with the most (an empty
    one pads). A budget halved after running out of memory holds for that step's later mini-batches in this
    call."""
    n_rows = len(data)
    size = rows_per_step(mini_batch_size, ranks)
    n_steps = optimizer_steps_per_epoch(n_rows, mini_batch_size, ranks)
    budgets = [budget] * len(steps)
    for _ in range(epochs):
        order = torch.randperm(n_rows, generator=generator).tolist()
        for step in range(n_steps):
            rows = order[step * size:(step + 1) * size]
            num_tokens, num_seqs = ranks.sum([float(data.loss_mask[rows].sum()), float(len(rows))])
            for i, update in enumerate(steps):
                budgets[i] = optimizer_step(update, data, rows, budgets[i], num_tokens, num_seqs, ranks)
