"""The hf engine's producer in a process of its own (rollout.async_training.producer: process).

    learner's process                                  producer process (spawned, one per rank)
    ProducerProcess.collect()   --- collect --->       Producer.collect(): the batch the producer thread played
                                <-- its episodes ---   ahead (rollout/producer.py), over its own engine and envs
    ProcessEngine.sync_weights(actor)
      actor -> `staging` (shared memory)
                                --- sync --->          HFEngine.sync_weights(staging): copied into the engine's
                                <-- its version ---    own module between two decode steps
    state_dict / load_state_dict / close               the producer's and the engine's

Why a process: the hf engine's decode loop and the learner share a process's GIL when the producer is a
thread; in a process of its own it has its own (benchmarks/producer_placement.py: a producer thread collects
0.83-0.85 as fast as a process beside the learner, and the learner runs 0.97-0.98 as fast). The price: a
second whole copy of the sampled policy (the staging copy the learner writes and the engine's own), a
process start-up (seconds), and each batch pickled across. Trained end to end on a 2-core CPU
(benchmarks/async.py --process) it was no faster than the thread (0.90-1.04x the thread's env steps per second),
so the thread is the default; the process is for learners whose Python the producer's would slow (a GPU's).

The producer process builds what the learner's process would have (assembly/collectors.py: the same envs and
collector, the same engine seed) and plays them under the same gate, so the staleness bound and the resume
rule are the producer's; the learner's process keeps the engine's version (the checkpoint's) in step with
it. Messages are one at a time, each answered, in the learner's order: the producer process only reads
`staging` while it answers a sync, so the learner writes it while nothing reads it. An error of the
producer process comes back as the exception its message raised there; a producer process that has died
is a RuntimeError at the next message. It ignores SIGINT and SIGTERM (the learner's process stops it, as it
stops the env workers) and ends when its pipe closes.
"""

from __future__ import annotations

import atexit
import dataclasses
import signal
import time
from collections.abc import Iterable
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing as mp
from transformers import PreTrainedTokenizerBase

from horizonrl import envs as env_registry
from horizonrl.config import TrainConfig
from horizonrl.engines.base import ScoredRow
from horizonrl.engines.hf import HFEngine, copy_weights
from horizonrl.learner.device import autocast_dtype, precision
from horizonrl.learner.distributed import LOCAL, Ranks
from horizonrl.learner.models import engine_copy
from horizonrl.records import Episode
from horizonrl.rollout.from_config import make_engine
from horizonrl.rollout.producer import Producer, TakenBatch, async_metrics
from horizonrl.assembly.collectors import make_collector, run_envs


class ProducerProcess:
    """The learner's side: a Collector (rollout/collector.py) whose batches a producer process plays ahead, at
    most `max_staleness` versions, from an hf engine over its own copy of `staging`'s weights; `engine` is what
    the learner syncs and checkpoints in place of that engine (ProcessEngine). `staging` (the policy's whole
    copy, moved to shared memory) is where each sync's weights go."""

    def __init__(self, cfg: TrainConfig, tokenizer: PreTrainedTokenizerBase, staging: torch.nn.Module,
                 ranks: Ranks = LOCAL):
        context = mp.get_context("spawn")
        self._pipe, theirs = context.Pipe()
        self._process = context.Process(
            target=serve, name="horizonrl-producer",
            args=(theirs, cfg, tokenizer, staging.share_memory(), dataclasses.replace(ranks, distributed=False),
                  torch.get_num_threads(), dict(env_registry.REGISTRY)))
        self._process.start()          # not a daemon: its env workers are processes of its own
        theirs.close()
        atexit.register(self._end)     # runs before multiprocessing's exit joins the process: see _end
        self.engine = ProcessEngine(self, staging)
        self.errors: list[str] = []
        self.counts: dict[str, int] = {}
        self.taken: TakenBatch | None = None

    def ask(self, message: str, *args):
        """Send `message` to the producer process and return its answer (raise its error)."""
        try:
            self._pipe.send((message, args))
            ok, answer = self._pipe.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            self._process.join(timeout=5)
            raise RuntimeError(f"the producer process ended (exit code {self._process.exitcode}) while the learner "
                               f"asked it to {message}; its error, if it printed one, is above") from None
        if not ok:
            raise answer
        return answer

    def collect(self) -> list[Episode]:
        """The next batch the producer process played (or waited for), as Producer.collect."""
        asked = time.perf_counter()
        episodes, self.errors, self.counts, taken = self.ask("collect")
        self.taken = dataclasses.replace(taken, waited_s=time.perf_counter() - asked)
        return episodes

    def metrics(self, ranks: Ranks = LOCAL) -> dict[str, float]:
        """async/* of the last batch taken (rollout/producer.async_metrics)."""
        return async_metrics(self.taken, self.engine.in_flight_at_sync, ranks)

    def state_dict(self) -> dict:
        return self.ask("state_dict")

    def load_state_dict(self, state: dict) -> None:
        self.ask("load_state_dict", state)

    def close(self) -> None:
        """Stop the producer process once its batches in flight have ended (a no-op once it has ended)."""
        if self._process.is_alive():
            self.ask("close")
        self._end()

    def _end(self, timeout_s: float = 60) -> None:
        """Close the pipe, so that the producer process ends once its message in hand is answered, and wait for
        it (killed after `timeout_s`). At exit, for a run that failed before `close` (a resume whose
        checkpoint does not load): else the exit would wait on the producer process, which waits on the pipe."""
        atexit.unregister(self._end)
        self._pipe.close()
        self._process.join(timeout_s)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()


class ProcessEngine:
    """What the learner's process holds of the producer process's hf engine: `sync_weights` writes the actor's
    weights into the shared staging copy and has the engine take them; its version and requests in flight at
    the last sync as the engine answered. Nothing generates here."""

    def __init__(self, process: ProducerProcess, staging: torch.nn.Module):
        self._process, self._staging = process, staging
        self.version = 0
        self.in_flight_at_sync = 0

    def sync_weights(self, model, tensors: Iterable[tuple[str, torch.Tensor]] | None = None) -> None:
        """As HFEngine.sync_weights, through the staging copy."""
        copy_weights(self._staging, model, tensors)
        copies_done(self._staging)
        self.version, self.in_flight_at_sync = self._process.ask("sync")

    def score(self, rows: list[ScoredRow]) -> list[list[float]]:
        """As HFEngine.score, by the producer process's engine."""
        return self._process.ask("score", rows)

    @property
    def weights_version(self) -> int:
        return self.version

    def state_dict(self) -> dict:
        return {"weights_version": self.version}

    def load_state_dict(self, state: dict) -> None:
        self._process.ask("load_engine_state", state)
        self.version = state["weights_version"]

    def sleep(self) -> None:
        """Nothing to free: the engine is in the producer process."""

    def close(self) -> None:
        """Nothing to stop: ProducerProcess.close ends the producer process, engine included."""


def serve(pipe: Connection, cfg: TrainConfig, tokenizer: PreTrainedTokenizerBase, staging: torch.nn.Module,
          ranks: Ranks, threads: int, registry: dict[str, env_registry.EnvSpec]) -> None:
    """The producer process: build the rank's envs (from the learner's env registry, the user's own envs
    included), an hf engine over a copy of `staging` and the collector, played by a Producer; then answer the
    learner's messages (the module docstring) until `close` or until the pipe closes."""
    env_registry.REGISTRY.update(registry)
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # sent to the whole process group (Ctrl-C, a scheduler):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)     # the learner's process stops the run, and this with it
    torch.set_num_threads(threads)
    with precision(cfg.precision):
        device = next(staging.parameters()).device
        model = engine_copy(staging, autocast_dtype(device) or torch.float32, device)
        engine: HFEngine = make_engine(model, tokenizer, cfg.rollout, cfg.seed, device)
        envs = run_envs(cfg, ranks)
        producer = Producer(make_collector(cfg, tokenizer, engine, model, envs, ranks),
                            cfg.rollout.async_training.max_staleness, lambda: engine.weights_version,
                            lambda: engine.in_flight_at_sync)

        def collect():
            episodes = producer.collect()
            return episodes, producer.errors, producer.counts, producer.taken

        def sync():
            engine.sync_weights(staging)
            copies_done(staging)
            return engine.weights_version, engine.in_flight_at_sync

        answers = {"collect": collect, "sync": sync, "state_dict": producer.state_dict,
                   "load_state_dict": producer.load_state_dict, "load_engine_state": engine.load_state_dict,
                   "score": engine.score,
                   "close": lambda: None}
        try:
            while True:
                try:
                    message, args = pipe.recv()
                except EOFError:       # the learner's process has gone
                    break
                try:
                    answer = (True, answers[message](*args))
                except Exception as error:     # raised in the learner's process, as itself if it pickles
                    answer = (False, error if pickles(error) else
                              RuntimeError(f"the producer process: {type(error).__name__}: {error}"))
                try:
                    pipe.send(answer)
                except OSError:        # the learner's process has gone
                    break
                if message == "close":
                    break
        finally:
            producer.close()
            for env in envs:
                env.close()


def copies_done(model: torch.nn.Module) -> None:
    """Wait for the copies queued on `model`'s GPU (CUDA kernels run asynchronously): the other process reads or
    writes the staging copy as soon as it is told to. Nothing to wait for on a CPU."""
    device = next(model.parameters()).device
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def pickles(value) -> bool:
    try:
        ForkingPickler.dumps(value)
    except Exception:
        return False
    return True
