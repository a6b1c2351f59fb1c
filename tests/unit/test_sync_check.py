"""The served-policy check (train/sync_check.py): the gap's baseline is the largest of the first iterations', and a
later gap past max(max_growth x baseline, min_gap) stops the run naming the engine and the gap."""

import pytest

from horizonrl.train.sync_check import EngineOutOfSync, SyncCheck


def records(*gaps):
    return [gap(i, g) for i, g in enumerate(gaps, start=1)]


def gap(iteration: int, value: float, current_frac: float = 1.0) -> dict:
    return {"iteration": iteration, "rollout/logprob_abs_diff_current": value,
            "rollout/current_weights_frac": current_frac}


def test_a_gap_past_ten_times_the_first_iterations_largest_stops_the_run():
    check = SyncCheck("the vllm engine", max_growth=10.0, min_gap=0.05, baseline_iterations=3)
    for record in records(0.004, 0.006, 0.005, 0.059, 0.06):       # limit max(10 x 0.006, 0.05) = 0.06
        check.check(record)
    with pytest.raises(EngineOutOfSync, match=r"the vllm engine sampled iteration 6's batch from other weights than "
                                              r"the learner's: rollout/logprob_abs_diff_current 0.0601 per token, against at "
                                              r"most 0.006 in iterations 1-3 \(limit 0.06 = max\(10 x that, 0.05\)\)"):
        check.check(gap(6, 0.0601))


def test_float_rounding_never_stops_the_run_below_min_gap():
    """A baseline of float rounding (1e-7) would make 1e-6 a limit; min_gap is the limit then."""
    check = SyncCheck("the hf engine", max_growth=10.0, min_gap=0.05, baseline_iterations=2)
    for record in records(1e-7, 2e-7, 3.5e-7, 0.049, 0.05):
        check.check(record)
    with pytest.raises(EngineOutOfSync, match=r"limit 0.05 = max\(10 x that, 0.05\)"):
        check.check(gap(6, 0.0501))


def test_records_without_a_gap_or_a_current_token_and_a_check_turned_off_pass():
    check = SyncCheck("the hf engine", max_growth=None, min_gap=0.05, baseline_iterations=1)
    for record in records(1e-7, 5.0):
        check.check(record)
    check = SyncCheck("the hf engine", max_growth=10.0, min_gap=0.05, baseline_iterations=1)
    for record in [{"iteration": 0}, gap(1, 0.01), {"iteration": 2}, gap(3, 0.0, current_frac=0.0), gap(4, 5.0, 0.0)]:
        check.check(record)                 # the critic warmup updates no actor; batches 3, 4 hold no current turn
    assert check.baseline == [(1, 0.01)]
