"""Failure types of whole episodes and the per-env summary, on hand-built episodes."""

import pytest

from horizonrl.records import Episode, Turn
from horizonrl.report.diagnostics import LOOP_REPEATS, LOOP_WINDOW, episode_summary, failure_type


def episode(observations, valid=None, success=False, end="truncated", error=None):
    """An episode whose turn k acted on observations[k]; `end` is how its last turn ended."""
    valid = valid if valid is not None else [True] * len(observations)
    turns = [Turn([1], [2], None, valid_action=v, info={"observation": o}) for o, v in zip(observations, valid)]
    setattr(turns[-1], end, True)
    metrics = ({"error": error} if error else
               {"success": float(success), "length": len(turns), "return": float(success), "invalid_actions": 0})
    return Episode("e", "river", 0, turns=turns, metrics=metrics)


def distinct(n):
    return [f"obs {k}" for k in range(n)]


def test_success_has_no_failure_type():
    assert failure_type(episode(["a", "a", "a", "a"], valid=[False] * 4, success=True, end="terminated")) is None


def test_invalid_output_needs_more_than_half_the_turns_invalid():
    assert failure_type(episode(distinct(4), valid=[False, False, False, True])) == "invalid_output"
    assert failure_type(episode(distinct(4), valid=[False, False, True, True])) == "time_out"   # exactly half


def test_invalid_output_comes_before_loop():
    assert failure_type(episode(["a"] * 4, valid=[False, False, False, True])) == "invalid_output"


def test_loop_is_one_observation_repeated_in_the_last_window():
    assert LOOP_REPEATS == 3
    assert failure_type(episode(["a", "b", "a", "c", "a"])) == "loop"
    assert failure_type(episode(["a", "b", "a", "c", "d"])) == "time_out"          # seen twice only
    assert failure_type(episode(["a", "b", "a", "c", "a"], end="terminated")) == "loop"
    # three times in the last LOOP_WINDOW turns; then one turn more pushes the first out of them
    assert failure_type(episode(["a", *distinct(LOOP_WINDOW - 3), "a", "a"])) == "loop"
    assert failure_type(episode(["a", *distinct(LOOP_WINDOW - 2), "a", "a"])) == "time_out"
    assert failure_type(episode(["a", "b", "a", "a"]), loop_window=3, loop_repeats=2) == "loop"


def test_time_out_and_other():
    assert failure_type(episode(distinct(6), end="truncated")) == "time_out"
    assert failure_type(episode(distinct(6), end="terminated")) == "other"


def test_summary_counts_failures_and_leaves_errored_episodes_out():
    episodes = [episode(distinct(5), success=True, end="terminated"), episode(["a"] * 3),
                episode(distinct(4), valid=[True, False, True, True]), episode(distinct(2), error="env crashed")]
    summary = episode_summary(episodes)
    assert summary["episodes"] == 3 and summary["errored_episodes"] == 1
    assert summary["success_rate"] == pytest.approx(1 / 3)
    assert summary["episode_length"] == pytest.approx(4.0) and summary["episode_return"] == pytest.approx(1 / 3)
    assert summary["valid_action_ratio"] == pytest.approx(11 / 12)
    assert summary["failures"] == {"invalid_output": 0, "loop": 1, "time_out": 1, "other": 0}


def test_summary_of_no_finished_episode_has_no_means():
    summary = episode_summary([episode(["a"], error="env crashed")])
    assert summary["episodes"] == 0 and summary["success_rate"] is None and summary["valid_action_ratio"] is None


def test_wilson_intervals_are_the_textbook_ones():
    """45 of 50: [0.7864, 0.9565]; 0 of 20: [0, 0.1611] (z = 1.96, worked by hand from the score formula)."""
    from horizonrl.report.diagnostics import wilson

    assert wilson(45, 50) == pytest.approx([0.9, 0.7864, 0.9565], abs=1e-4)
    assert wilson(0, 20) == pytest.approx([0.0, 0.0, 0.1611], abs=1e-4)


def test_game_outcomes_count_each_games_end_and_skip_other_envs_and_errors():
    from horizonrl.report.diagnostics import game_outcomes

    def game(outcome, error=None):
        e = episode(["board"], end="terminated", error=error)
        e.turns[-1].info["metrics"] = {name: float(name == outcome) for name in ("win", "draw", "loss", "illegal")}
        if outcome == "illegal":
            e.turns[-1].info["metrics"]["loss"] = 1.0
        return e

    outcomes = game_outcomes([game("win"), game("win"), game("draw"), game("illegal"), game("win", error="boom")])
    assert {k: outcomes[k] for k in ("games", "win", "draw", "loss", "illegal")} == \
        {"games": 4, "win": 2, "draw": 1, "loss": 1, "illegal": 1}
    assert outcomes["win_rate"][0] == 0.5
    assert game_outcomes([episode(distinct(3))]) is None
