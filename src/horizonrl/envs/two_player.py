"""What every two-player game env here (envs/openspiel_env.py, envs/textarena_env.py) reports the same way: the
opponent spec of self-play, a seat's outcome metrics, and the info of a self-play game's last step, which the
collector splits by seat (rollout/seats.py)."""

from __future__ import annotations

SELF_PLAY = "self"   # the opponent spec of self-play: the policy plays every seat
OUTCOMES = ("win", "draw", "loss", "illegal")   # the metrics a game's last step reports, 1 for the one that happened


def outcome_metrics(result: float, illegal: bool = False) -> dict[str, float]:
    """A seat's `OUTCOMES` (1 for those that happened) from its return: a loss is any negative return."""
    happened = (result > 0, result == 0 and not illegal, result < 0, illegal)
    return {name: float(value) for name, value in zip(OUTCOMES, happened, strict=True)}


def self_play_end(returns: list[float], illegal: bool, progress: float) -> dict:
    """The info of a self-play game's last step: every seat's return (rollout/seats.py), success when the first seat
    won, and the game's metrics."""
    metrics = {"first_seat_win": float(returns[0] > 0 and not illegal),
               "draw": float(all(r == 0 for r in returns) and not illegal), "illegal": float(illegal)}
    return {"success": returns[0] > 0, "progress": progress, "metrics": metrics,
            "seat_returns": [float(r) for r in returns]}
