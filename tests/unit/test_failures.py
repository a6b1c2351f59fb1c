"""Failed rollouts (rollout/failures.py): one summary line per distinct cause, the most common first, with
counts; one warning per batch; and a batch in which nothing succeeded is one RolloutsFailed on every rank,
naming the causes of all of them (ranks simulated by threads, as in test_metrics_over_ranks.py)."""

import logging

import pytest
from test_metrics_over_ranks import on_ranks

from horizonrl.rollout.failures import CAUSE_CHARS, RolloutsFailed, log_failures, raise_if_none_succeeded, summary_lines


def test_causes_are_counted_most_common_first_and_the_rest_summed():
    causes = ["b"] * 2 + ["a"] * 5 + ["c"] * 3 + ["d", "e", "e"]
    assert summary_lines(causes) == ["a (5)", "c (3)", "b (2)", "3 more of 2 other causes"]
    assert summary_lines(["x", "y"]) == ["x (1)", "y (1)"]          # ties: first seen first
    assert summary_lines(["a"] * 3 + ["b", "c", "d"])[-1] == "1 more of 1 other cause"


def test_a_long_or_multiline_cause_is_one_cut_line():
    (line,) = summary_lines(["agent raised BadRequestError:\n  " + "x" * 1000])
    assert "\n" not in line and line.startswith("agent raised BadRequestError: xxx")
    assert line.endswith("... (1)") and len(line) == CAUSE_CHARS + len(" (1)")


def test_a_batchs_failures_are_one_warning(caplog):
    with caplog.at_level(logging.DEBUG, logger="horizonrl.rollout.failures"):
        log_failures([], "of 4 rollouts dropped")                       # none: nothing logged
        log_failures(["agent raised E: x"] * 3 + ["agent timed out after 1 s"], "of 4 rollouts dropped")
    assert [r.getMessage() for r in caplog.records] == [
        "4 of 4 rollouts dropped: agent raised E: x (3); agent timed out after 1 s (1)"]


def test_a_batch_with_one_success_goes_on_and_one_with_none_raises_the_summary():
    raise_if_none_succeeded(1, 4, ["e"] * 3, "episode of the batch", "nothing trains")
    with pytest.raises(RolloutsFailed) as failed:
        raise_if_none_succeeded(0, 4, ["e"] * 3 + ["f"], "episode of the batch", "nothing trains")
    assert str(failed.value) == ("every episode of the batch failed (4 of 4), so nothing trains; the failures, most "
                                 "common first:\n  e (3)\n  f (1)")


def test_on_ranks_every_rank_raises_the_same_error_when_one_rank_has_no_success():
    """Rank 1 failed all of its 2 episodes, rank 0 one of its 2: both raise, naming rank 1 and every failure."""
    def rank_fails(ranks) -> str:
        succeeded, causes = [(1, ["env error x"]), (0, ["env error x", "env error y"])][ranks.rank]
        try:
            raise_if_none_succeeded(succeeded, 2, causes, "episode of the batch", "the update has no rows", ranks)
        except RolloutsFailed as failed:
            return str(failed)
        return "went on"

    messages, _ = on_ranks(2, rank_fails)
    assert messages == [("every episode of the batch on rank 1 failed (failed per rank: 1 of 2, 2 of 2), so the "
                         "update has no rows; the failures, most common first:\n  env error x (2)\n"
                         "  env error y (1)")] * 2
    went_on, _ = on_ranks(2, lambda ranks: raise_if_none_succeeded(1, 2, [], "x", "y", ranks))   # both succeeded
    assert went_on == [None, None]
