"""Asynchronous rollouts: a producer thread collects the next batches while the learner trains on the last.

    producer thread   collector.produce(admitted, deliver) in an event loop of its own: batch b = 1, 2, ...
                      starts once `admitted(b)` says the learner has asked for batch b - K; each batch ended is
                      delivered (queued) with the collector's state after it
    learner           collect(): ask for the next batch -> wait until it is queued -> take it

The learner asks for batch b right after the weight sync that follows its update on batch b-1, so when
batch b starts the engine holds the weights of version v(b-1-K) or newer, and every turn of batch b was
sampled by one of them (a turn keeps the version its sampling started under: conservative when a sync
falls inside it). Batch b trains the policy of version v(b-1): no trained turn is more than K versions
older than the policy it trains, which `collect` checks on every batch. K = 0 would be collect, then
train, as one loop; the training loop then runs without a producer.

What a collector overlaps: the group collectors start batch b+1's rollouts while the slowest rollouts of
batch b still run (a long-tailed tool or env no longer idles the others, rollout/groups.py); the
fixed-turn collector's batches follow each other, as each stream's next fragment follows its last.
Episodes running across a sync continue (partial rollouts): every engine takes the new weights between
two of its steps, so later turns, and the rest of a turn in flight, use them (engines/hf.py: the request's
KV so far is kept; engines/vllm_engine.py and engines/openai_server.py: vLLM preempts it and recomputes it
with the new weights).

A checkpoint keeps the collector's state right after the last batch the learner took (`state_dict`: the
state each batch is delivered with); batches collected ahead of the learner are not saved, and a resumed
run collects them again under its restored weights, so the bound holds across `--resume`.

A thread of the learner's process (the hf engine runs in this process): the engine's decode steps and the
learner's passes are torch kernels that release the GIL; the two threads contend for the Python between them.
Measured on the default job (benchmarks/producer_placement.py, BENCHMARKS.md): beside a producer thread the
learner runs 0.97-0.98 as fast as beside a producer process, the producer thread 0.83-0.85 as fast as a process
would. `rollout.async_training.producer: process` runs this same Producer in a process of its own, with its own
engine and envs (assembly/producer_process.py).
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from horizonrl.learner.distributed import LOCAL, Ranks
from horizonrl.records import Episode
from horizonrl.rollout.collector import Collector


@dataclass
class TakenBatch:
    """What the learner reads of the last batch it took: the staleness of each of its turns (versions between the
    one that sampled it and the policy it trains), how long the producer waited at the gate before starting it,
    how long the producer took to play it (from its start to its delivery: `timing/rollout_s`), and how long the
    learner waited for it."""

    staleness: list[int]
    gated_s: float
    played_s: float
    waited_s: float


def async_metrics(taken: TakenBatch, in_flight_at_sync: int, ranks: Ranks = LOCAL) -> dict[str, float]:
    """async/* of a batch taken, over every rank's: its turns' staleness (mean, max), the producer's and the
    learner's waits (each a mean over the ranks) and the engine's requests in flight at its last weight update
    (summed)."""
    total, turns, gated, waited, in_flight = ranks.sum([sum(taken.staleness), len(taken.staleness), taken.gated_s,
                                                        taken.waited_s, in_flight_at_sync])
    return {"async/staleness_mean": total / max(turns, 1),
            "async/staleness_max": ranks.max(max(taken.staleness, default=0)),
            "async/producer_wait_s": gated / ranks.world_size, "async/learner_wait_s": waited / ranks.world_size,
            "async/turns_in_flight_at_sync": int(in_flight)}


@dataclass
class ProducedBatch:
    """A batch the producer collected: its episodes, the collector's errors and counts of it, the
    collector's state after it, how long it waited at the gate before it started and how long it played."""

    episodes: list[Episode]
    errors: list[str]
    counts: dict[str, int]
    state: dict
    gated_s: float
    played_s: float


class Producer:
    """A Collector (rollout/collector.py) that plays `collector` in a thread of its own, at most
    `max_staleness` batches ahead of the learner (see the module docstring). `weights_version()`: the
    engine's version now (the policy the learner updates next); `in_flight_at_sync()`: the engine's
    requests in flight at its last weight update. The thread starts at the first `collect`, after a
    resume has loaded the collector's state; `close` stops it once its batches in flight end."""

    def __init__(self, collector: Collector, max_staleness: int, weights_version: Callable[[], int],
                 in_flight_at_sync: Callable[[], int]):
        if max_staleness < 1:
            raise ValueError(f"max_staleness {max_staleness}: a producer runs ahead of the learner by 1 or more")
        self.collector, self.max_staleness = collector, max_staleness
        self.weights_version, self.in_flight_at_sync = weights_version, in_flight_at_sync
        self.errors: list[str] = []
        self.counts: dict[str, int] = {}
        self._changed = threading.Condition()   # guards what follows, shared with the producer thread
        self._requested = 0                     # batches the learner asked for
        self._delivered = 0                     # batches the collector delivered
        self._started: dict[int, tuple[float, float]] = {}  # batch -> (seconds at the gate, when it started)
        self._ready: collections.deque[ProducedBatch] = collections.deque()
        self._failure: BaseException | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None   # the producer thread's, while it runs
        self._gate: asyncio.Future | None = None              # what the gate awaits; set by `_changed_now`
        self._state: dict | None = None         # the collector's, after the last batch taken (None: its own)
        self.taken: TakenBatch | None = None     # the last batch the learner took

    def collect(self) -> list[Episode]:
        """The next batch (collected ahead, or waited for). RuntimeError if one of its turns is more than
        max_staleness versions older than the engine's weights now: the gate above failed."""
        asked = time.perf_counter()
        with self._changed:
            self._requested += 1
            self._changed_now()
        if self._thread is None:
            self._thread = threading.Thread(target=self._produce, name="horizonrl-producer", daemon=True)
            self._thread.start()
        with self._changed:
            self._changed.wait_for(lambda: self._ready or self._failure is not None)
            if not self._ready:          # the batches collected before a failure are taken first
                raise self._failure
            produced = self._ready.popleft()
        version = self.weights_version()
        staleness = [version - t.info["weights_version"] for e in produced.episodes for t in e.turns
                     if t.info.get("weights_version") is not None]
        if staleness and max(staleness) > self.max_staleness:
            raise RuntimeError(f"a batch holds a turn sampled {max(staleness)} weight versions before the policy it "
                               f"trains (version {version}); the bound is {self.max_staleness}")
        self.errors, self.counts, self._state = produced.errors, produced.counts, produced.state
        self.taken = TakenBatch(staleness, produced.gated_s, produced.played_s, time.perf_counter() - asked)
        return produced.episodes

    def metrics(self, ranks: Ranks = LOCAL) -> dict[str, float]:
        """async/* of the last batch taken, over every rank's (`async_metrics`)."""
        return async_metrics(self.taken, self.in_flight_at_sync(), ranks)

    def _produce(self) -> None:
        """The producer thread: the collector's batches, each once the gate lets it start, until `close`."""
        asyncio.run(self._produce_until_failure())

    async def _produce_until_failure(self) -> None:
        """The collector's `produce`; its failure goes to the learner from inside the event loop, before the loop
        shuts down (which waits for whatever the failure left running)."""
        with self._changed:
            self._loop = asyncio.get_running_loop()
        try:
            await self.collector.produce(self._admitted, self._deliver)
        except BaseException as error:    # the learner raises it at its next collect
            with self._changed:
                self._failure = error
                self._changed.notify_all()
        finally:
            with self._changed:
                self._loop = None

    async def _admitted(self, b: int) -> bool:
        """Whether batch b may start (False: the producer stops), once the learner has asked for batch b - K. The
        wait is the event loop's own (a future the learner's thread resolves), so a failure can cancel it."""
        opened = time.perf_counter()
        while True:
            with self._changed:
                if self._stopping or self._requested >= b - self.max_staleness:
                    break
                self._gate = self._loop.create_future()
            await self._gate
        started = time.perf_counter()
        self._started[b] = (started - opened, started)
        return not self._stopping

    def _changed_now(self) -> None:
        """With `_changed` held: wake the learner's wait and the producer's gate."""
        self._changed.notify_all()
        gate, loop = self._gate, self._loop
        if gate is not None and loop is not None:
            loop.call_soon_threadsafe(lambda: gate.done() or gate.set_result(None))

    def _deliver(self, episodes: list[Episode], errors: list[str], counts: dict[str, int], state: dict) -> None:
        delivered = time.perf_counter()
        with self._changed:
            self._delivered += 1
            gated_s, started = self._started.pop(self._delivered)
            self._ready.append(ProducedBatch(episodes, list(errors), dict(counts), state, gated_s,
                                             delivered - started))
            self._changed.notify_all()

    def state_dict(self) -> dict:
        """The collector's state right after the last batch the learner took (batches collected ahead are
        not kept: a resumed run collects them again)."""
        return self.collector.state_dict() if self._state is None else self._state

    def load_state_dict(self, state: dict) -> None:
        """Before the first `collect` (a resume)."""
        if self._thread is not None:
            raise RuntimeError("the producer is running: load the collector's state before the first collect")
        self.collector.load_state_dict(state)

    def close(self) -> None:
        """Stop the producer thread (once the batches in flight have ended) and close the collector."""
        with self._changed:
            self._stopping = True
            self._changed_now()
        if self._thread is not None:
            self._thread.join()
        self.collector.close()
