"""Self-play episodes by seat: one game whose every seat the policy played becomes one episode per seat.

An env whose one policy plays every seat (`openspiel:<game>` with `opponent: self`) gives its turns to the seats in
turn (`Turn.seat`), reward 0 at each step, and each seat's return at the end (`info["seat_returns"]`). `by_seat`
makes an episode of each seat's turns: its last turn gets the seat's return (on top of its invalid-output penalty)
and the seat's outcome among the game's metrics (`win`, `draw`, `loss`, `illegal` as a one-seat game reports them:
envs/openspiel_env.py), its group is the game's group and the seat (`<group id>/seat<s>`: a group estimator
compares the seat's games of one seed, never one seat with the other), its outcome reward and metrics are the
seat's. A seat an opponent played (`Turn.policy`, rollout/seat_opponents.py) makes no episode: it is not trained.
A game cut before its end (an env error, the turn limit) has no returns: each seat's episode keeps the rewards its
turns had.

What this simplifies: the prompts of a seat must not carry the game's history (the turn before is the other
seat's), so self-play needs `agent.memory: 0` (the observation spells out the game so far), and PPO's fixed-turn
streams, whose GAE runs over a stream's consecutive turns, play one seat only (`alternates` finds the game that
does not fit, on its first turn).
"""

from __future__ import annotations

import dataclasses

from horizonrl.envs.two_player import outcome_metrics
from horizonrl.records import Episode, Turn


def alternates(episode: Episode, turn: Turn) -> bool:
    """Whether `turn`, about to join `episode`, is another seat's than the turn before it."""
    return bool(episode.turns) and turn.seat is not None and turn.seat != episode.turns[-1].seat


def by_seat(episode: Episode) -> list[Episode]:
    """`episode` as one episode per seat the policy played when the policy played a game's seats (module
    docstring), else [episode]."""
    seats = sorted({turn.seat for turn in episode.turns if turn.seat is not None})
    last = episode.turns[-1] if episode.turns else None
    if len(seats) < 2 and (last is None or "seat_returns" not in last.info):
        return [episode]
    returns = last.info.get("seat_returns") if episode.finished and "error" not in episode.metrics else None
    out = []
    for seat in seats:
        turns = [dataclasses.replace(turn) for turn in episode.turns if turn.seat == seat]
        if turns[0].policy is not None:
            continue
        turns[-1].terminated, turns[-1].truncated = last.terminated, last.truncated
        if returns is not None:
            turns[-1].reward += returns[seat]
            game = last.info.get("metrics")            # a game's outcome; a gateway program's agents have none
            if game is not None:
                illegal = bool(game.get("illegal")) and last.seat == seat
                turns[-1].info = {**turns[-1].info, "metrics": {**game, **outcome_metrics(returns[seat], illegal)}}
        total = sum(turn.reward for turn in turns)
        metrics = {"error": episode.metrics["error"]} if "error" in episode.metrics else {
            "return": total, "length": len(turns), "success": float(returns is not None and returns[seat] > 0),
            "invalid_actions": sum(not turn.valid_action for turn in turns)}
        out.append(Episode(f"{episode.episode_id}/seat{seat}", episode.task, episode.seed,
                           f"{episode.group_id}/seat{seat}", turns, None, total, metrics, episode.data))
    return out
