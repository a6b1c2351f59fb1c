"""Supervised fine-tuning on training rows: cross-entropy on the loss-mask (assistant) tokens only."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Literal

import torch
from tqdm import tqdm

from horizonrl.algos.losses import aggregate
from horizonrl.learner.scoring import token_logprobs
from horizonrl.learner.shared_prefix import Sharing
from horizonrl.records import SampleBatch
from horizonrl.samples.tensors import Rows

log = logging.getLogger(__name__)


def supervised_finetune(model, batch: SampleBatch, pad_id: int, steps: int, batch_size: int, lr: float,
                        seed: int = 0, grad_clip: float = 1.0, check: Callable[[], None] = lambda: None,
                        lr_decay: Literal["constant", "cosine"] = "constant", progress: bool = False,
                        desc: str = "sft", sharing: Sharing | None = None) -> list[float]:
    """AdamW on  -sum(mask * log p(token)) / sum(mask)  over random mini-batches of the rows whose mask is not
    all zero, at the learning rate lr x sft_lr_factor(lr_decay, ...), `check()` before every step (it may raise
    to stop: the model is then left as the steps so far made it). The loss and the time so far are logged every
    tenth of the steps and at the last: a real model's warm start takes minutes. With `progress`, a tqdm bar
    named `desc` on stderr counts the optimizer steps (with its ETA) and shows the last step's loss. The forward
    shares the rows' prefixes with `sharing` (learner/shared_prefix.py).

    Returns the loss of every step. A batch with no such rows is a ValueError (there is nothing to learn from).
    """
    learnable = [i for i, mask in enumerate(batch.loss_mask) if any(mask)]
    if not learnable and steps:
        raise ValueError(f"supervised fine-tuning has no rows to learn from ({steps} steps asked): no "
                         "demonstration turn (turns that deviated from the expert are not learned from)")
    device = next(model.parameters()).device
    data = Rows.of(batch, pad_id, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda done: sft_lr_factor(lr_decay, done, steps))
    generator = torch.Generator().manual_seed(seed)
    n_rows = len(learnable)
    losses = []
    start, log_every = time.monotonic(), max(1, steps // 10)
    with tqdm(range(1, steps + 1), desc=desc, unit="step", disable=not progress, dynamic_ncols=True) as bar:
        for step in bar:
            check()
            rows = [learnable[i] for i in torch.randint(n_rows, (min(batch_size, n_rows),),
                                                        generator=generator).tolist()]
            mb = data.select(rows)
            logp, _ = token_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask, sharing=sharing)
            loss = -aggregate(logp, mb.loss_mask, "token-mean")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
            if step % log_every == 0 or step == steps:
                log.info("sft step %d/%d: loss %.4f, %.0f s", step, steps, losses[-1], time.monotonic() - start)
    return losses


def sft_lr_factor(decay: Literal["constant", "cosine"], done: int, steps: int) -> float:
    """The learning rate of step done + 1 over the configured one: constant 1, or cosine
    (1 + cos(pi * done / steps)) / 2, from 1 at the first step towards 0 at the last."""
    if decay == "constant":
        return 1.0
    return 0.5 * (1 + math.cos(math.pi * done / max(steps, 1)))
