"""The trainer's update throughput against a bare forward + backward of the same networks on the same
tokens, in the same process; prints one JSON object.

    python benchmarks/update_efficiency.py [--model builtin:smollm2-135m-instruct] [--rows 8] [--tokens 300]
                                           [--spread 0.1] [--sampled 32] [--micro-batch-size ROWS] [--repeats 1]

The batch: `rows` rows of about `tokens` tokens (lengths uniform in tokens * (1 +- spread), random ids), the
last `sampled` of each in the loss mask, with old log-probs, advantages, old values and returns as a PPO
batch has them. The update: `learner.update.minibatch_updates` as train/ppo.ppo_iteration calls it (the
critic's clipped value loss, then the actor's PPO loss; one epoch, the whole batch one mini-batch, in
micro-batches of `micro_batch_size` rows, by default one; AdamW steps). The ceiling: for the actor,
model(input_ids).logits -> log_softmax -> gather the sampled tokens -> masked mean -> backward; for the
critic, the same body -> value head -> masked mean squared error -> backward; the whole batch in one pass,
no optimizer step. (The ceiling computes the logits of every position, the trainer those of the sampled
tokens only: with a large vocabulary the ratio can pass 1.) Tokens per second count every attended token
of the batch; `ratio` = update / ceiling. Each side is timed `repeats` times after one warm-up run (medians).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import time

import torch

from horizonrl.config import MicroBatchBudget
from horizonrl.learner.device import autocast_dtype
from horizonrl.learner.models import ValueModel, load_policy
from horizonrl.learner.scoring import score
from horizonrl.learner.update import Stats, UpdateStep, actor_loss_fn, critic_loss_fn, minibatch_updates
from horizonrl.samples.tensors import Rows


def ppo_batch(actor, critic, rows: int, tokens: int, spread: float, sampled: int, vocab: int) -> Rows:
    """Right-padded random rows, the last `sampled` tokens of each sampled, scored as a PPO batch is."""
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(int(tokens * (1 - spread)), int(tokens * (1 + spread)) + 1, (rows,), generator=generator)
    positions = torch.arange(int(lengths.max()))
    attention_mask = (positions < lengths[:, None]).long()
    loss_mask = (attention_mask * (positions >= (lengths - sampled)[:, None])).float()
    data = Rows(torch.randint(vocab, attention_mask.shape, generator=generator) * attention_mask, attention_mask,
                loss_mask)
    data = dataclasses.replace(data, **score(data, MicroBatchBudget(rows), actor=actor, critic=critic).given())
    advantages = torch.randn(loss_mask.shape, generator=generator) * loss_mask
    returns = torch.randn(loss_mask.shape, generator=generator) * loss_mask
    return dataclasses.replace(data, advantages=advantages, returns=returns)


def trainer_update(actor, critic, data: Rows, micro_batch_size: int) -> float:
    """Seconds of one minibatch_updates call of critic and actor over the whole batch."""
    rows = len(data)
    steps = [UpdateStep(torch.optim.AdamW(critic.parameters(), lr=1e-7), critic_loss_fn(critic, 0.5, 3.0), 1.0,
                        Stats()),
             UpdateStep(torch.optim.AdamW(actor.parameters(), lr=1e-7),
                        actor_loss_fn(actor, 0.2, 0.2, 3.0, 0.001, "token-mean", 1.0), 1.0, Stats())]
    started = time.perf_counter()
    minibatch_updates(data, rows, MicroBatchBudget(micro_batch_size), 1, torch.Generator().manual_seed(0), steps)
    return time.perf_counter() - started


def bare_update(actor, critic, data: Rows) -> float:
    """Seconds of the plain forward + backward of the actor and of the critic on the same tokens."""
    ids, attention, mask = data.input_ids, data.attention_mask, data.loss_mask[:, 1:]
    started = time.perf_counter()
    log_probs = actor(input_ids=ids, attention_mask=attention).logits[:, :-1].float().log_softmax(dim=-1)
    logp = log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1)
    (-(logp * mask).sum() / mask.sum()).backward()
    del log_probs, logp
    values = critic(ids, attention)[:, :-1]
    (((values - data.returns[:, 1:]) ** 2 * mask).sum() / mask.sum()).backward()
    elapsed = time.perf_counter() - started
    actor.zero_grad(set_to_none=True)
    critic.zero_grad(set_to_none=True)
    return elapsed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--spread", type=float, default=0.1)
    parser.add_argument("--sampled", type=int, default=32)
    parser.add_argument("--micro-batch-size", type=int, help="rows per forward/backward pass (default: all)")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device("cpu")
    _, actor = load_policy(args.model, device)
    actor.eval()                                   # as a run holds it: dropout off
    critic = ValueModel.from_policy(actor).eval()
    torch.nn.init.normal_(critic.value_head.weight, std=0.01)
    data = ppo_batch(actor, critic, args.rows, args.tokens, args.spread, args.sampled, actor.config.vocab_size)
    micro_batch_size = args.micro_batch_size or args.rows
    tokens = float(data.attention_mask.sum())
    seconds = {"update": [], "ceiling": []}
    for repeat in range(args.repeats + 1):        # the first run of each warms up
        for name, run in (("update", functools.partial(trainer_update, micro_batch_size=micro_batch_size)),
                          ("ceiling", bare_update)):
            elapsed = run(actor, critic, data)
            if repeat:
                seconds[name].append(elapsed)
    update_s, ceiling_s = (statistics.median(seconds[k]) for k in ("update", "ceiling"))
    print(json.dumps({"update_tokens_per_s": tokens / update_s, "ceiling_tokens_per_s": tokens / ceiling_s,
                      "ratio": ceiling_s / update_s, "update_s": update_s, "ceiling_s": ceiling_s,
                      "tokens": int(tokens), "rows": args.rows, "micro_batch_size": micro_batch_size,
                      "sampled_per_row": args.sampled,
                      "model": args.model, "params": sum(p.numel() for p in actor.parameters()),
                      "learner_autocast": str(autocast_dtype(device)), "threads": torch.get_num_threads()},
                     indent=1))


if __name__ == "__main__":
    main()
