"""Per-turn vs prefix-merged rows for full-history episodes; prints one JSON object.

    python benchmarks/samples.py [--episodes 8]

Episodes of T = 4, 8, 16 turns with full-history prompts (prompt_k = prompt_{k-1} + response + an
observation), sized like the toy recipe's (first prompt 60 tokens, responses 20, observations 30),
on the toy recipe's tiny model (hidden 128, 2 layers). For each T: training tokens per episode and the
wall time per episode of one actor update (forward + backward over every row, one optimizer step),
per_turn vs merged, with the measured token ratio next to the theoretical one:
    per_turn tokens = sum_{k=0}^{T-1} (P + k (R + O) + R),   merged tokens = P + T R + (T - 1) O.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time

import torch

from horizonrl.config import MicroBatchBudget, TinyModel
from horizonrl.learner.models import build_tiny_policy
from horizonrl.learner.tokenizer import train_bpe_tokenizer
from horizonrl.learner.update import Stats, UpdateStep, actor_loss_fn, minibatch_updates
from horizonrl.records import Episode, Turn
from horizonrl.samples.merge import merge_turns
from horizonrl.samples.per_turn import per_turn
from horizonrl.samples.tensors import Rows

P, R, O = 60, 20, 30  # noqa: E741 (the docstring's names)


def full_history_episode(turns: int, vocab: int, rng: random.Random, name: str) -> Episode:
    ids = lambda n: [rng.randrange(3, vocab) for _ in range(n)]  # noqa: E731
    prompt, episode = ids(P), Episode(name, "bench", 0)
    for k in range(turns):
        response = ids(R)
        episode.turns.append(Turn(prompt, response, None, reward=0.0, terminated=k == turns - 1))
        prompt = prompt + response + ids(O)
    return episode


def theoretical_ratio(turns: int) -> float:
    per_turn_tokens = sum(P + k * (R + O) + R for k in range(turns))
    return per_turn_tokens / (P + turns * R + (turns - 1) * O)


def update_seconds(model, samples, micro_batch_size: int) -> tuple[float, int]:
    data = Rows.of(samples, 0)
    data = dataclasses.replace(data, logp_old=torch.zeros(data.loss_mask.shape),
                               advantages=torch.randn(data.loss_mask.shape) * data.loss_mask)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    loss = actor_loss_fn(model, 0.2, 0.2, 3.0, 0.0, "token-mean", 1.0)
    rows = len(data)
    started = time.perf_counter()
    minibatch_updates(data, rows, MicroBatchBudget(micro_batch_size), 1, torch.Generator().manual_seed(0),
                      [UpdateStep(optimizer, loss, 1.0, Stats())])
    return time.perf_counter() - started, int(data.attention_mask.sum())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = train_bpe_tokenizer(["a b c d e f g"] * 10, 256)
    tiny = TinyModel(hidden_size=128, intermediate_size=384)
    model = build_tiny_policy(tokenizer, tiny.hidden_size, tiny.num_layers, tiny.num_heads, tiny.num_kv_heads,
                              tiny.intermediate_size, tiny.max_position_embeddings, seed=0)
    rng, results = random.Random(0), {}
    for turns in (4, 8, 16):
        episodes = [full_history_episode(turns, len(tokenizer), rng, f"e{i}") for i in range(args.episodes)]
        merged, report = merge_turns(episodes)
        assert report.rows == len(episodes), "full-history episodes must merge into one row each"
        update_seconds(model, per_turn(episodes[:1]), 8)          # warm up
        per_turn_s, per_turn_tokens = update_seconds(model, per_turn(episodes), 8)
        merged_s, merged_tokens = update_seconds(model, merged, 8)
        results[f"T={turns}"] = {
            "per_turn_tokens_per_episode": per_turn_tokens / len(episodes),
            "merged_tokens_per_episode": merged_tokens / len(episodes),
            "token_ratio": per_turn_tokens / merged_tokens, "theoretical_token_ratio": theoretical_ratio(turns),
            "per_turn_update_s_per_episode": per_turn_s / len(episodes),
            "merged_update_s_per_episode": merged_s / len(episodes),
            "time_ratio": per_turn_s / merged_s,
        }
    print(json.dumps({"episodes": args.episodes, "P": P, "R": R, "O": O, **results}, indent=1))


if __name__ == "__main__":
    main()
