"""Diagnostics of whole episodes (Verlog's checks before training): how often the policy succeeds,
how long and how rewarding its episodes are, how often it names a valid action, and why each failed
episode failed. Pure functions over finished episodes; `horizonrl eval` reports them per env.
"""

from __future__ import annotations

import math
from collections import Counter

from horizonrl.envs.two_player import OUTCOMES
from horizonrl.records import Episode

FAILURE_TYPES = ("invalid_output", "loop", "time_out", "other")
LOOP_WINDOW = 10    # turns at the end of an episode searched for a repeated observation
LOOP_REPEATS = 3    # occurrences of one observation in that window that make a loop


def failure_type(episode: Episode, loop_window: int = LOOP_WINDOW, loop_repeats: int = LOOP_REPEATS) -> str | None:
    """Why a finished episode failed; None when it succeeded (`metrics["success"]`). The first rule
    that holds, in this order:

    invalid_output  more than half of its turns named no valid action (the env ran its default action);
    loop            among the observations the agent acted on in its last `loop_window` turns
                    (`turn.info["observation"]`), one occurs `loop_repeats` times or more;
    time_out        its last turn was truncated (the env's time limit or the collector's turn limit);
    other           the env terminated it without success (e.g. the game was lost).
    """
    if episode.metrics["success"]:
        return None
    turns = episode.turns
    if 2 * sum(not turn.valid_action for turn in turns) > len(turns):
        return "invalid_output"
    seen = Counter(turn.info["observation"] for turn in turns[-loop_window:])
    if max(seen.values()) >= loop_repeats:
        return "loop"
    if turns[-1].truncated:
        return "time_out"
    return "other"


def episode_summary(episodes: list[Episode]) -> dict:
    """Means over the finished episodes (one closed by an env error counts only in `errored_episodes`):
    success rate, episode length and return (env reward plus invalid-action penalties), the fraction of
    their turns with a valid action, and the count of each failure type. Means of no episodes are None."""
    finished = [e for e in episodes if "error" not in e.metrics]
    failures = Counter(failure_type(e) for e in finished)
    return {
        "episodes": len(finished),
        "success_rate": mean_or_none([e.metrics["success"] for e in finished]),
        "episode_length": mean_or_none([e.metrics["length"] for e in finished]),
        "episode_return": mean_or_none([e.metrics["return"] for e in finished]),
        "valid_action_ratio": mean_or_none([float(t.valid_action) for e in finished for t in e.turns]),
        "failures": {kind: failures[kind] for kind in FAILURE_TYPES},
        "errored_episodes": len(episodes) - len(finished),
    }


def game_outcomes(episodes: list[Episode]) -> dict | None:
    """For a two-player game's episodes (their last turn reports OUTCOMES, envs/openspiel_env.py): how many ended
    in each outcome, and each outcome's rate with its 95% Wilson interval [rate, low, high]; None for other envs."""
    ends = [e.turns[-1].info.get("metrics", {}) for e in episodes if e.turns and "error" not in e.metrics]
    ends = [end for end in ends if set(OUTCOMES) <= set(end)]
    if not ends:
        return None
    counts = {name: sum(int(end[name]) for end in ends) for name in OUTCOMES}
    return {"games": len(ends), **counts, **{f"{name}_rate": wilson(counts[name], len(ends)) for name in OUTCOMES}}


def wilson(successes: int, n: int, z: float = 1.96) -> list[float]:
    """[rate, low, high]: the rate of `successes` in `n` and its Wilson score interval (95% for z = 1.96)."""
    rate = successes / n
    centre = (rate + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [rate, max(centre - half, 0.0), min(centre + half, 1.0)]


def mean_or_none(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
