"""The producer's gate (rollout/producer.py): batch b starts only once the learner has asked for batch b - K,
so no trained turn is more than K weight versions older than the policy it trains; the checkpointed state
is the collector's right after the last batch taken; a collector's failure reaches the learner.

The collector here plays no env: each batch is one episode whose turns carry the engine's weights version
when they were sampled (a counter the simulated learner bumps after each update), which is all the gate
reads. Integration tests run it on real envs and the hf engine (tests/integration/test_async_training.py)."""

import asyncio
import contextlib
import threading
import time

import pytest

from horizonrl.records import Episode, Turn
from horizonrl.rollout.groups import GroupCollector
from horizonrl.rollout.producer import Producer
from horizonrl.rollout.seeds import first_training_seed


class VersionedCollector:
    """Batch b: one episode of `turns` turns, sampled one by one (`turn_s` apart) with the current version;
    the batches follow each other (as the fixed-turn collector's do). Batch `hold`, once started, sets `holding`
    and waits for `release` before its turns."""

    def __init__(self, version: list[int], turns: int = 3, turn_s: float = 0.002, fail_at: int | None = None,
                 hold: int | None = None):
        self.version, self.turns, self.turn_s, self.fail_at, self.hold = version, turns, turn_s, fail_at, hold
        self.holding, self.release = threading.Event(), threading.Event()
        self.batches = 0
        self.started_with_requested: list[int] = []   # the learner's requests when each batch started
        self.producer: Producer | None = None
        self.errors, self.counts = [], {}

    async def produce(self, admitted, deliver) -> None:
        b = 0
        while await admitted(b := b + 1):
            self.batches += 1
            self.started_with_requested.append(self.producer._requested)
            if self.batches == self.fail_at:
                raise RuntimeError("env reset failed 3 times in a row")
            if self.batches == self.hold:
                self.holding.set()
                await asyncio.to_thread(self.release.wait, 60)
            turns = []
            for _ in range(self.turns):
                turns.append(Turn([1], [2], [-0.5], info={"weights_version": self.version[0]}))
                await asyncio.sleep(self.turn_s)
            deliver([Episode(f"batch{self.batches}", "task", self.batches, turns=turns)],
                    [f"error in batch {self.batches}"], {"gateway/requests": self.batches}, self.state_dict())

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


def wait_until(producer: Producer, condition) -> None:
    """Until `condition()` holds, read under the producer's lock and again at each change it signals (a batch
    delivered, asked for or taken, a stop). The 60 s bound only turns a hang into a failure."""
    with producer._changed:
        assert producer._changed.wait_for(condition, timeout=60), "the producer never got there"


@pytest.mark.parametrize("max_staleness", [1, 2, 3])
def test_no_turn_is_older_than_the_bound_and_the_bound_is_reached(max_staleness):
    version = [0]
    collector = VersionedCollector(version)
    producer = producer_over(collector, max_staleness)
    staleness = []
    for _ in range(8):
        episodes = producer.collect()
        staleness.append(max(version[0] - t.info["weights_version"] for t in episodes[0].turns))
        # the update, slower than a batch: the producer runs ahead meanwhile, as far as its gate lets it
        wait_until(producer, lambda: len(producer._ready) == max_staleness)
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
    wait_until(producer, lambda: producer._delivered == 4)    # the producer collects batches 3 and 4 meanwhile
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


def test_a_batch_played_ahead_is_timed_where_it_was_played():
    """A batch queued before the learner asks for it took the producer at least its turns' sleeps (3 x 0.02 s) to
    play: that, not the learner's wait for it, is the batch's rollout time."""
    collector = VersionedCollector([0], turns=3, turn_s=0.02)
    producer = producer_over(collector, 1)
    producer.collect()
    with producer._changed:
        producer._changed.wait_for(lambda: producer._ready)     # batch 2 is queued
    producer.collect()
    assert producer.taken.played_s >= 0.06
    producer.close()


def test_a_turn_older_than_the_bound_is_refused():
    """The gate cannot let it happen; a collector that hands over old turns anyway (here: the version jumps
    between the batch and the take) is caught when the learner takes the batch."""
    version = [0]
    collector = VersionedCollector(version)
    producer = producer_over(collector, 1)
    producer.collect()
    wait_until(producer, lambda: producer._ready)     # batch 2 is collected at version 0
    version[0] = 2
    with pytest.raises(RuntimeError, match="sampled 2 weight versions before the policy it trains"):
        producer.collect()
    producer.close()


def test_close_waits_for_the_batch_in_progress_and_starts_no_other():
    """Batch 2 is held in progress until close has begun: close waits for it to end, and starts no batch 3."""
    collector = VersionedCollector([0], turns=5, turn_s=0.02, hold=2)
    producer = producer_over(collector, 1)
    producer.collect()
    assert collector.holding.wait(60)                    # batch 2 is in progress
    closing = threading.Thread(target=producer.close)
    closing.start()
    wait_until(producer, lambda: producer._stopping)     # close has begun...
    assert closing.is_alive()                            # ...and waits for batch 2
    collector.release.set()
    closing.join(60)
    assert not closing.is_alive()
    assert collector.batches == 2 and producer._delivered == 2
    assert not any(t.name == "horizonrl-producer" for t in threading.enumerate())


def test_a_producer_needs_a_bound_of_at_least_one():
    with pytest.raises(ValueError, match="ahead of the learner by 1 or more"):
        Producer(VersionedCollector([0]), 0, lambda: 0, lambda: 0)


class StragglerTasks:
    """A group player whose rollout 0 of the task at `slow_seed` (a straggler) runs until `others` other rollouts
    have ended, every other rollout `fast_s`; it records when each rollout started and ended, and counts rollouts.
    (The straggler's 60 s bound only turns a wait for rollouts that never come into a failure.)"""

    failures = "rollouts failed"

    def __init__(self, version: list[int], slow_seed: int, others: int, fast_s: float = 0.01):
        self.version, self.slow_seed, self.others, self.fast_s = version, slow_seed, others, fast_s
        self.times: dict[tuple[int, int], tuple[float, float]] = {}
        self.played = 0
        self.others_ended = asyncio.Event()     # bound to the producer's event loop at its first wait

    def task(self, j: int, seed: int) -> tuple[int, int]:
        return j, seed

    async def play(self, task, k: int, errors: list[str]) -> Episode:
        j, seed = task
        started = time.perf_counter()
        turn = Turn([1], [2], [-0.5], info={"weights_version": self.version[0]})
        if (seed, k) == (self.slow_seed, 0):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.others_ended.wait(), 60)
        else:
            await asyncio.sleep(self.fast_s)
        self.times[(seed, k)] = (started, time.perf_counter())
        self.played += 1
        if self.played >= self.others:
            self.others_ended.set()
        return Episode(f"seed{seed}/rollout{k}", "task", seed, group_id=f"seed{seed}", turns=[turn], outcome_reward=1.0)

    def batch(self):
        return contextlib.nullcontext()

    def counters(self) -> dict[str, int]:
        return {"rollouts": self.played}

    def close(self) -> None:
        pass


def test_group_batches_overlap_the_slowest_rollouts_of_the_batch_before():
    """K = 1: batch 2 is drawn once the learner asks for batch 1, while batch 1's straggler runs (it runs until the
    other 5 rollouts of batch 1 and the 6 of batch 2 have ended: a producer that waited for it before drawing batch 2
    would never see them), so batch 2's rollouts start and end before batch 1 ends (batch 1's counts hold them);
    batches are delivered whole and in order, each with the seed counter after it was drawn."""
    version = [0]
    first = first_training_seed(0)
    player = StragglerTasks(version, slow_seed=first, others=5 + 6)
    collector = GroupCollector(player, n_tasks=2, group_size=3, seed=0)
    producer = Producer(collector, 1, lambda: version[0], lambda: 0)
    batch1 = producer.collect()
    assert {e.seed for e in batch1} == {first, first + 1} and len(batch1) == 6
    assert producer.counts == {"rollouts": 6 + 6}      # batch 2's rollouts ended during batch 1's straggler
    assert producer.state_dict() == {"next_seed": first + 2}
    straggler_ended = player.times[(first, 0)][1]
    batch2_ended = max(ended for (seed, _), (_, ended) in player.times.items() if seed >= first + 2)
    assert batch2_ended < straggler_ended
    version[0] += 1
    batch2 = producer.collect()
    assert {e.seed for e in batch2} == {first + 2, first + 3}
    assert producer.state_dict() == {"next_seed": first + 4}
    producer.close()


class FailsWhileTheNextBatchRuns:
    """A group player (one task a batch, one rollout a task) whose batch 2 raises once batch 3 has started, and
    whose batch 3 runs until `release` is set: the failure must reach the learner while batch 3 runs, and the
    producer's gate for batch 4 (K = 1: it waits for the learner's 3rd collect, which never comes) must not
    hold it back."""

    failures = "rollouts failed"

    def __init__(self):
        self.first = first_training_seed(0)
        self.release = threading.Event()
        self.batch_3_started: asyncio.Event | None = None
        self.batch_3_ended = False

    def task(self, j: int, seed: int) -> int:
        return seed - self.first + 1                       # the batch

    async def play(self, batch: int, k: int, errors: list[str]) -> Episode:
        if self.batch_3_started is None:
            self.batch_3_started = asyncio.Event()
        if batch == 2:
            await self.batch_3_started.wait()
            raise RuntimeError("the env's server went away")
        if batch == 3:
            self.batch_3_started.set()
            while not self.release.is_set():
                await asyncio.sleep(0.01)
            self.batch_3_ended = True
        turn = Turn([1], [2], [-0.5], info={"weights_version": 0})
        return Episode(f"batch{batch}", "task", batch, group_id=f"batch{batch}", turns=[turn], outcome_reward=1.0)

    def batch(self):
        return contextlib.nullcontext()

    def counters(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        pass


def test_a_rollout_that_raises_reaches_the_learner_while_the_next_batch_runs():
    """K = 1: batch 2 raises while batch 3 runs (it never ends until the test releases it) and the gate of batch 4
    waits for a collect that never comes; the learner's wait for batch 2 ends with the error all the same.
    (The 60 s bound only turns a hang into a failure; the pass is the error's arrival.)"""
    player = FailsWhileTheNextBatchRuns()
    producer = Producer(GroupCollector(player, n_tasks=1, group_size=1, seed=0), 1, lambda: 0, lambda: 0)
    assert producer.collect()[0].episode_id == "batch1"
    outcome: list[BaseException] = []
    learner = threading.Thread(target=lambda: outcome.append(pytest.raises(RuntimeError, producer.collect).value))
    learner.start()
    learner.join(timeout=60)
    player.release.set()
    assert not learner.is_alive(), "the learner still waits for batch 2"
    assert "server went away" in str(outcome[0]) and not player.batch_3_ended
    producer.close()
    assert not any(t.name == "horizonrl-producer" for t in threading.enumerate())
