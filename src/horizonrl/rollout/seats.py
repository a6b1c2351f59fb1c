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

PPO's fixed-turn streams cut an episode at the batch's end and bootstrap from the critic; a self-play game is not
cut (`seats_to_come`: the stream plays it to its end, a few turns past `ppo.e_len` at most), so that each seat's
episode is whole and its GAE runs over that seat's turns alone, the critic reading whose turn it is from the prompt.

What this simplifies: the prompts of a seat must not carry the game's history (the turn before is the other
seat's), so self-play needs `agent.memory: 0` (the observation spells out the game so far; `check_seat_history`
refuses the rest on the game's first change of seat).
"""

from __future__ import annotations

import dataclasses

from horizonrl.agents.agent import Agent
from horizonrl.envs.two_player import outcome_metrics
from horizonrl.errors import ConfigError
from horizonrl.records import Episode, Turn


def check_seat_history(episode: Episode, turn: Turn, agent: Agent) -> None:
    """A ConfigError naming agent.memory when `turn`, about to join `episode`, is another seat's than the turn before
    it and `agent`'s prompts carry history (they would show a seat the other's turns)."""
    if episode.turns and turn.seat is not None and turn.seat != episode.turns[-1].seat and (
            agent.memory > 0 or agent.history == "full"):
        raise ConfigError(f"agent.memory: {episode.task} gives its turns to every seat (self-play), and a prompt with "
                          f"history (memory {agent.memory}, history {agent.history}) would show a seat the other's "
                          "turns; set agent.memory=0")


def seats_to_come(episode: Episode | None, next_seat: int | None) -> bool:
    """Whether `episode` is a running game the policy plays in more than one seat: its turns and `next_seat` (the
    env's seat to move) span two seats."""
    if episode is None or not episode.turns:
        return False
    seats = {turn.seat for turn in episode.turns} | {next_seat}
    return None not in seats and len(seats) > 1


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
        group = None if episode.group_id is None else f"{episode.group_id}/seat{seat}"     # PPO's streams: None
        out.append(Episode(f"{episode.episode_id}/seat{seat}", episode.task, episode.seed, group, turns, None, total,
                           metrics, episode.data))
    return out
