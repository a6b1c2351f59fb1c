"""Sample trajectories for the run report: a few episodes of each iteration's batch, turn by turn,
one JSON line per episode in runs/<name>/trajectories.jsonl.

    {"iteration", "episode_id", "task", "seed", "finished", "success", "return", "outcome_reward",
     "turns": [{"tokens", "mask", "context_cut", "response_cut", "action", "valid_action", "reward",
                "advantage", "terminated", "truncated"}, ...]}

`success` and `return` come from the episode's summary (None on a fragment that is not the episode's
last, with fixed-turn batching), `outcome_reward` from a group run's reward function (else None).

Where a turn sits in the training rows. Both sample builders (`per_turn`, `merge_turns`) emit one
Segment per turn, in episode order then turn order, and in both `row[:segment.start] ==
turn.prompt_ids` (a merged row holds prompt_0 | response_0 | obs_0 | ..., and each turn's prompt is
exactly that prefix). So turn k of the i-th episode with turns is segment `sum(len(turns) of the
episodes before) + k` whatever the builder: no per-builder mapping, merged rows included.

Per turn, `tokens` are the row's ids over [segment.start - n_context, segment.start + n_response),
each id decoded on its own (so the viewer can colour every token), and `mask` the row's loss mask
over the same span: 0 on the context, 1 on the response. The context is the turn's *new* prompt: the
ids after its longest common prefix with the previous turn's prompt + response (the whole prompt for
the first turn of a fragment). With a token-exact history that is exactly the observation; an agent
that rebuilds a memory window replays its last turns, so only the last `context_tokens` ids are kept
(`context_cut` counts the ones dropped from the front) and the first `response_tokens` ids of the
response (`response_cut` counts the ones dropped from the end).

`advantage` is the mean of the row-layout `advantages` over all the turn's response tokens (kept or
cut): GAE in PPO, the episode's broadcast group advantage in group runs; None if not finite.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from torch import Tensor

from horizonrl import runfolder
from horizonrl.records import Episode, SampleBatch



def trajectory_records(iteration: int, episodes: list[Episode], samples: SampleBatch, advantages: Tensor,
                       tokenizer, n_episodes: int = 2, context_tokens: int = 64,
                       response_tokens: int = 64) -> list[dict]:
    """Records of `n_episodes` episodes with turns, evenly spaced over `episodes` (the first included),
    whose rows are `samples` and whose row-layout advantages [R, T] are `advantages`."""
    offsets, first = {}, 0
    for i, episode in enumerate(episodes):
        offsets[i] = first
        first += len(episode.turns)
    if first != len(samples.segments):
        raise ValueError(f"{first} turns in the episodes but {len(samples.segments)} segments in the samples")
    chosen = evenly_spaced([i for i, e in enumerate(episodes) if e.turns], n_episodes)
    return [_episode_record(iteration, episodes[i], samples, offsets[i], advantages, tokenizer, context_tokens,
                            response_tokens) for i in chosen]


def evenly_spaced(items: list, n: int) -> list:
    """At most n items, evenly spaced, the first included (and the last, when n > 1)."""
    if len(items) <= n:
        return list(items)
    step = (len(items) - 1) / max(n - 1, 1)
    return [items[round(j * step)] for j in range(n)]


def _episode_record(iteration: int, episode: Episode, samples: SampleBatch, first_segment: int, advantages: Tensor,
                    tokenizer, context_tokens: int, response_tokens: int) -> dict:
    turns = []
    for k, turn in enumerate(episode.turns):
        segment = samples.segments[first_segment + k]
        previous = episode.turns[k - 1].prompt_ids + episode.turns[k - 1].response_ids if k else []
        new_context = len(turn.prompt_ids) - _common_prefix(turn.prompt_ids, previous)
        kept_context = min(new_context, context_tokens)
        kept_response = min(segment.length, response_tokens)
        span = slice(segment.start - kept_context, segment.start + kept_response)
        advantage = float(advantages[segment.row, segment.start:segment.start + segment.length].mean())
        turns.append({
            "tokens": [tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
                       for i in samples.input_ids[segment.row][span]],
            "mask": [int(m) for m in samples.loss_mask[segment.row][span]],
            "context_cut": new_context - kept_context,
            "response_cut": segment.length - kept_response,
            "action": turn.action, "valid_action": turn.valid_action, "reward": turn.reward,
            "advantage": advantage if math.isfinite(advantage) else None,
            "terminated": turn.terminated, "truncated": turn.truncated,
            "weights_version": turn.info.get("weights_version"),
        })
    return {"iteration": iteration, "episode_id": episode.episode_id, "task": episode.task, "seed": episode.seed,
            "finished": episode.finished, "success": episode.metrics.get("success"),
            "return": episode.metrics.get("return"), "outcome_reward": episode.outcome_reward, "turns": turns}


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def write_trajectories(run_dir: Path, records: list[dict]) -> None:
    """Append one JSON line per record to run_dir/trajectories.jsonl."""
    with (Path(run_dir) / runfolder.TRAJECTORIES).open("a", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
