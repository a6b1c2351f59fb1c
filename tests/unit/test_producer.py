"""The producer's gate (rollout/producer.py): batch b starts only once the learner has asked for batch b - K,
so no trained turn is more than K weight versions older than the policy it trains; the checkpointed state
is the collector's right after the last batch taken; a collector's failure reaches the learner.

The collector here plays no env: each batch is one episode whose turns carry the engine's weights version
when they were sampled (a counter the simulated learner bumps after each update), which is all the gate
reads. Integration tests run it on real envs and the hf engine (tests/integration/test_async_training.py)."""

import threading
import time

import pytest

from horizonrl.records import Episode, Turn
from horizonrl.rollout.producer import Producer


class VersionedCollector:
    """Batch b: one episode of `turns` turns, sampled one by one (`turn_s` apart) with the current version."""

    def __init__(self, version: list[int], turns: int = 3, turn_s: float = 0.002, fail_at: int | None = None):
        self.version, self.turns, self.turn_s, self.fail_at = version, turns, turn_s, fail_at
        self.batches = 0
        self.started_with_requested: list[int] = []   # the learner's requests when each batch started
        self.producer: Producer | None = None
        self.errors, self.counts = [], {}

    def collect(self) -> list[Episode]:
        self.batches += 1
        self.started_with_requested.append(self.producer._requested)
        if self.batches == self.fail_at:
            raise RuntimeError("env reset failed 3 times in a row")
        turns = []
        for _ in range(self.turns):
            turns.append(Turn([1], [2], [-0.5], info={"weights_version": self.version[0]}))
            time.sleep(self.turn_s)
        self.errors, self.counts = [f"error in batch {self.batches}"], {"gateway/requests": self.batches}
        return [Episode(f"batch{self.batches}", "task", self.batches, turns=turns)]

    def state_dict(self) -> dict:
        return {"next_batch": self.batches + 1, "history": [self.batches]}

    def load_state_dict(self, state: dict) -> None:
        self.batches = state["next_batch"] - 1

    def close(self) -> None:
        self.closed = True


def producer_over(collector: VersionedCollector, max_staleness: int) -> Producer:
    producer = Producer(collector, max_staleness, lambda: collector.version[0], lambda: 0)
    collector.producer = producer
    return producer


@pytest.mark.parametrize("max_staleness", [1, 2, 3])
def test_no_turn_is_older_than_the_bound_and_the_bound_is_reached(max_staleness):
    version = [0]
    collector = VersionedCollector(version)
    producer = producer_over(collector, max_staleness)
    staleness = []
    for _ in range(8):
        episodes = producer.collect()
        staleness.append(max(version[0] - t.info["weights_version"] for t in episodes[0].turns))
        time.sleep(0.03)              # the update: the producer runs ahead meanwhile
        version[0] += 1               # the sync
    producer.close()
    # batch b (1-based) started once the learner had asked for batch b - K (hand: max(0, b - K) requests)
    for b, requested in enumerate(collector.started_with_requested, start=1):
        assert requested >= b - max_staleness
    assert max(staleness) == max_staleness     # the update is slower than a batch: the producer is always full
    assert staleness[0] == 0
    assert collector.closed


def test_the_checkpointed_state_is_the_collectors_after_the_last_batch_taken():
    version = [0]
    collector = VersionedCollector(version)
    producer = producer_over(collector, 2)
    assert producer.state_dict() == {"next_batch": 1, "history": [0]}     # before any batch: the collector's own
    producer.collect()
    version[0] += 1
    state = producer.collect()
    time.sleep(0.05)                                     # the producer collects batches 3 and 4 meanwhile
    assert collector.batches == 4
    assert state[0].episode_id == "batch2"
    assert producer.state_dict() == {"next_batch": 3, "history": [2]}
    assert producer.errors == ["error in batch 2"] and producer.counts == {"gateway/requests": 2}
    producer.close()


def test_a_resumed_producer_starts_from_the_loaded_state():
    collector = VersionedCollector([5])
    producer = producer_over(collector, 1)
    producer.load_state_dict({"next_batch": 7, "history": [6]})
    assert producer.collect()[0].episode_id == "batch7"
    with pytest.raises(RuntimeError, match="before the first collect"):
        producer.load_state_dict({"next_batch": 1, "history": [0]})
    producer.close()


def test_the_collectors_failure_reaches_the_learner():
    collector = VersionedCollector([0], fail_at=2)
    producer = producer_over(collector, 1)
    producer.collect()
    with pytest.raises(RuntimeError, match="reset failed 3 times"):
        producer.collect()
    producer.close()


def test_a_turn_older_than_the_bound_is_refused():
    """The gate cannot let it happen; a collector that hands over old turns anyway (here: the version jumps
    between the batch and the take) is caught when the learner takes the batch."""
    version = [0]
    collector = VersionedCollector(version)
    producer = producer_over(collector, 1)
    producer.collect()
    time.sleep(0.05)               # batch 2 is collected at version 0
    version[0] = 2
    with pytest.raises(RuntimeError, match="sampled 2 weight versions before the policy it trains"):
        producer.collect()
    producer.close()


def test_close_waits_for_the_batch_in_progress_and_starts_no_other():
    collector = VersionedCollector([0], turns=5, turn_s=0.02)
    producer = producer_over(collector, 1)
    producer.collect()
    time.sleep(0.01)                # batch 2 is in progress
    producer.close()
    assert collector.batches == 2
    assert not any(t.name == "horizonrl-producer" for t in threading.enumerate())


def test_a_producer_needs_a_bound_of_at_least_one():
    with pytest.raises(ValueError, match="ahead of the learner by 1 or more"):
        Producer(VersionedCollector([0]), 0, lambda: 0, lambda: 0)
