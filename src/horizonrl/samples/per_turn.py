"""per_turn: one training row per Turn (its own prompt + response; mask 1 on the sampled ids)."""

from __future__ import annotations

from horizonrl.records import Episode, SampleBatch, Segment


def per_turn(episodes: list[Episode]) -> SampleBatch:
    """Rows in episode order, turns in time order.

    Each turn's segment links to the next turn of its episode fragment; the last turn of a fragment
    that did not terminate (batch cut or time-limit truncation) points to the fragment's bootstrap
    prompt, whose value stands in for the rest of the episode.
    """
    input_ids: list[list[int]] = []
    loss_mask: list[list[int]] = []
    segments: list[Segment] = []
    bootstrap_prompts: list[list[int]] = []
    for episode in episodes:
        for k, turn in enumerate(episode.turns):
            bootstrap = check_turn(episode, k, bootstrap_prompts)
            last = k == len(episode.turns) - 1
            segments.append(Segment(
                row=len(input_ids), start=len(turn.prompt_ids), length=len(turn.response_ids),
                reward=turn.reward, episode_end=turn.terminated,
                next_segment=-1 if last else len(segments) + 1, bootstrap=bootstrap,
            ))
            input_ids.append(turn.prompt_ids + turn.response_ids)
            loss_mask.append([0] * len(turn.prompt_ids) + [1] * len(turn.response_ids))
    return SampleBatch(input_ids, loss_mask, segments, bootstrap_prompts)


def check_turn(episode: Episode, k: int, bootstrap_prompts: list[list[int]]) -> int:
    """Check turn k of `episode` (a non-empty response); for the last turn of a fragment that did not
    terminate, append the fragment's bootstrap prompt to `bootstrap_prompts`. Returns the bootstrap
    prompt's index, or -1."""
    if not episode.turns[k].response_ids:
        raise ValueError(f"episode {episode.episode_id} turn {k} has an empty response")
    if k < len(episode.turns) - 1 or episode.turns[k].terminated:
        return -1
    if episode.bootstrap_prompt_ids is None:
        raise ValueError(f"episode {episode.episode_id} ends without termination but has no bootstrap prompt")
    bootstrap_prompts.append(episode.bootstrap_prompt_ids)
    return len(bootstrap_prompts) - 1
