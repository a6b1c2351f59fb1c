"""Checkpoints: model folders, and the resumable training state of a run.

A model folder holds the actor and tokenizer as a Hugging Face folder (safetensors) and the critic
beside it (`critic/model.safetensors`); it loads back with `model.path=<folder>`. A run writes `init/` (the
tiny model before RL) and `checkpoint/` (the model at the end).

Every `save_every` iterations, after the last one and when a SIGINT/SIGTERM asked the run to stop, the
run also writes `checkpoints/iter_NNNNNN/`, what `horizonrl train --resume RUN` needs to continue
exactly where the run was (`TrainingState`), written by every rank of a torchrun job:
    dcp/                         actor, critic and their AdamW states by parameter name, as
                                 torch.distributed.checkpoint shards: they load at any world size
    training_state.safetensors   each rank's RNG states ("rank<r>/rng/torch", ".../rng/cuda/<device>",
                                 ".../rng/shuffle")
    opponent_pool.safetensors    with selfplay.pool_size: the pool's members' weights
    training_state.json          iteration, world size, the engine's weights version, RAE's baselines
                                 (algos/rae.py), the pool's members, each rank's collector state (env streams),
                                 served-policy check (probe rows, floor: assembly/sync_check.py) and
                                 python and numpy RNG states
The reference policy is not saved: it is the run's initial policy, reloaded from `init/` (tiny
model) or from `model.path`, which must still hold the weights the run started from; a resumed run
loads it, then the checkpoint's weights over it. `horizonrl export` turns a checkpoint into a model
folder.

Every folder is written into `<name>.tmp` beside its final name, fsynced, then renamed, so a folder
under its final name is complete; only the last complete `iter_*` folder is kept (the older ones are
removed once the new one is in place), and a leftover `*.tmp` folder (a crash mid-write) is removed
on resume.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_state_dict, set_model_state_dict,
                                                     set_state_dict)
from torch.distributed.checkpoint.stateful import Stateful
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from horizonrl import runfolder
from horizonrl.config import ConfigError, TrainConfig, dump, load_config
from horizonrl.engines.base import TrainingEngine
from horizonrl.algos.rae import RoleBaselines
from horizonrl.learner.distributed import LOCAL, Ranks, full_state_dict
from horizonrl.learner.lora import adapter_state, is_peft, merged_parameters, save_adapters
from horizonrl.rollout.collector import Collector
from horizonrl.rollout.seat_opponents import NO_OPPONENT, SeatOpponent
from horizonrl.runstate.budget import Progress

log = logging.getLogger(__name__)
# the only overrides `--resume` takes
RESUMABLE_KEYS = ("iterations", "save_every", "budget.env_steps", "budget.wall_clock_s")
_ITERATION_FOLDER = re.compile(r"iter_(\d{6})")
DCP_FOLDER = "dcp"   # the networks and optimizers, torch.distributed.checkpoint shards
OPPONENT_POOL = "opponent_pool.safetensors"   # a pool's members' weights (selfplay.pool_size)


class CheckpointError(ValueError):
    """A run cannot be resumed or exported: no complete checkpoint, or one that does not match the run."""


class TrainingStopped(Exception):
    """A stop signal ended the run at an iteration boundary, after a checkpoint was saved."""

    def __init__(self, run_dir: Path, iteration: int, signum: int):
        self.run_dir, self.iteration, self.signum = run_dir, iteration, signum
        super().__init__(f"stopped by {signal.Signals(signum).name} after iteration {iteration} (checkpoint "
                         f"{run_dir / runfolder.CHECKPOINTS / iteration_folder(iteration)}); continue with:\n"
                         f"    horizonrl train --resume {run_dir}")


class StoppedBeforeCheckpoint(Exception):
    """A stop signal ended the run before its first checkpoint (in the warm start, the critic warmup), at a
    point between two of their steps: nothing was half-written, and there is nothing to resume from."""

    def __init__(self, signum: int, during: str, run_dir: Path | None):
        self.signum, self.during, self.run_dir = signum, during, run_dir
        saved = ("before the run folder was made: nothing was saved" if run_dir is None else
                 f"before the first checkpoint: the run folder {run_dir} has none to resume from")
        super().__init__(f"stopped by {signal.Signals(signum).name} during {during}, {saved}; start the run again")


def save_checkpoint(folder: Path, actor, tokenizer, critic=None, ranks: Ranks = LOCAL) -> Path:
    """Write the model folder `folder` atomically: the actor as a plain Hugging Face model (sharded
    weights gathered whole, adapters merged), a LoRA actor's adapters in `adapter/`, the critic in
    `critic/model.safetensors`. Every rank calls; rank 0 writes."""
    folder = Path(folder)
    actor_state = {name: tensor.cpu() for name, tensor in merged_parameters(actor) if ranks.is_main}
    adapters = adapter_state(actor) if is_peft(actor) else None
    critic_state = full_state_dict(critic, ranks) if critic is not None else None
    if ranks.is_main:
        with atomic_folder(folder) as tmp:
            plain = actor.get_base_model() if is_peft(actor) else actor
            plain.save_pretrained(tmp, safe_serialization=True, state_dict=actor_state)
            tokenizer.save_pretrained(tmp)
            if adapters is not None:
                save_adapters(actor, tmp / "adapter", adapters)
            if critic_state is not None:     # a folder of its own: servers load every *.safetensors beside a model
                (tmp / "critic").mkdir()
                save_file({k: v.detach().contiguous() for k, v in critic_state.items()},
                          str(tmp / "critic" / "model.safetensors"))
    ranks.barrier()
    return folder


@contextmanager
def atomic_folder(folder: Path) -> Iterator[Path]:
    """Yields `<folder>.tmp` (emptied) to write into; then fsyncs its files, renames it to `folder`
    (replacing an older one) and fsyncs the parent. If the block raises, the temporary folder goes."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    commit_folder(tmp, folder)


def commit_folder(tmp: Path, folder: Path) -> None:
    """fsync every file of `tmp`, rename it to `folder` (replacing an older one), fsync the parent."""
    for path in tmp.rglob("*"):
        if path.is_file():
            _fsync(path)
    _fsync(tmp)
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)
    _fsync(folder.parent)


def write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` by `text` in one rename: a reader sees the old file or the new one, whole."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    _fsync(tmp)
    os.replace(tmp, path)
    _fsync(path.parent)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def iteration_folder(iteration: int) -> str:
    return f"iter_{iteration:06d}"


@dataclass
class TrainingState:
    """Everything a run changes as it trains, besides its logs. `save` and `restore` see it at an
    iteration boundary: after `engine.sync_weights` (see HFEngine.state_dict) or the critic warmup,
    with no episode fragment pending in the collector (with asynchronous training, the producer's
    collector as it was right after the last batch trained: rollout/producer.py). The engine's and
    the collector's states are JSON-able dicts. Every rank of a torchrun job calls `save` and
    `restore` (collectives)."""

    actor: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    actor_opt: torch.optim.Optimizer
    shuffle: torch.Generator
    engine: TrainingEngine
    collector: Collector
    sync_check: Stateful           # the served-policy check (assembly/sync_check.py): its probe rows and measures
    critic: torch.nn.Module | None = None
    critic_opt: torch.optim.Optimizer | None = None
    ranks: Ranks = LOCAL
    progress: Progress = field(default_factory=Progress)
    role_baselines: RoleBaselines = field(default_factory=RoleBaselines)   # RAE's (algos/rae.py), every rank's
    opponent: SeatOpponent = NO_OPPONENT    # a self-play game's other seat (rollout/seat_opponents.py): its pool

    def save(self, run_dir: Path, iteration: int) -> Path:
        """Write checkpoints/iter_<iteration>/ atomically (after fsyncing the run's logs, so they hold
        every record up to `iteration`), then remove the older checkpoints."""
        folder = run_dir / runfolder.CHECKPOINTS / iteration_folder(iteration)
        tmp = folder.with_name(folder.name + ".tmp")
        if self.ranks.is_main:
            for name in (runfolder.METRICS, runfolder.TRAJECTORIES):
                if (run_dir / name).exists():
                    _fsync(run_dir / name)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.ranks.barrier()
        dcp.save(self._networks(self._stepped()), checkpoint_id=tmp / DCP_FOLDER, no_dist=not self.ranks.distributed)
        self.write(tmp, iteration)
        if self.ranks.is_main:
            commit_folder(tmp, folder)
            for old in complete_checkpoints(run_dir):
                if old != folder:
                    shutil.rmtree(old)
        self.ranks.barrier()
        return folder

    def write(self, folder: Path, iteration: int) -> None:
        """training_state.safetensors and training_state.json, from every rank's state (rank 0 writes)."""
        everyone = self.ranks.gather(self._rank_state())
        opponent, opponent_tensors = self.opponent.state_dict()      # the same on every rank
        if self.ranks.is_main:
            save_file({f"rank{r}/{key}": value for r, (t, _) in enumerate(everyone) for key, value in t.items()},
                      str(folder / "training_state.safetensors"))
            if opponent_tensors:
                save_file(opponent_tensors, str(folder / OPPONENT_POOL))
            (folder / "training_state.json").write_text(json.dumps(
                {"iteration": iteration, "world_size": self.ranks.world_size, "engine": self.engine.state_dict(),
                 "progress": self.progress.state_dict(), "optimizers": sorted(self._stepped()),
                 "role_baselines": self.role_baselines.state_dict(), "opponent": opponent,
                 "ranks": [m for _, m in everyone]}))

    def restore(self, folder: Path) -> int:
        """Load the state saved in `folder` into these objects, whatever the world size it was saved
        at (the networks and optimizers are resharded; the env streams are shared out again; the RNG
        states are those of the same rank, or of rank 0 for a rank that did not exist); returns the
        iteration it was saved after."""
        meta = json.loads((folder / "training_state.json").read_text())
        stepped = set(meta.get("optimizers", ("actor_opt", "critic_opt")))
        state = self._networks(stepped)
        dcp.load(state, checkpoint_id=folder / DCP_FOLDER, no_dist=not self.ranks.distributed)
        for name, model, optimizer in self._trained():
            if f"{name}_opt" in stepped:
                set_state_dict(model, optimizer, model_state_dict=state[name], optim_state_dict=state[f"{name}_opt"])
            else:
                set_model_state_dict(model, state[name])
        tensors = load_file(str(folder / "training_state.safetensors"))
        saved = meta["ranks"]
        rank = self.ranks.rank if self.ranks.rank < len(saved) else 0
        self.engine.sync_weights(self.actor, merged_parameters(self.actor))   # it was built from the initial policy
        self.engine.load_state_dict(meta["engine"])
        self.progress.load_state_dict(meta.get("progress", {"env_steps": 0, "wall_clock_s": 0.0}))
        self.role_baselines.load_state_dict(meta.get("role_baselines", {}))
        if (folder / OPPONENT_POOL).exists():
            self.opponent.load_state_dict(meta["opponent"], load_file(str(folder / OPPONENT_POOL)))
        try:
            self.collector.load_state_dict(collector_share(self.collector, [m["collector"] for m in saved], self.ranks))
        except ValueError as error:   # the streams do not match the run's, or an env replays differently
            raise CheckpointError(f"{folder}: {error}") from None
        # RNG states last: nothing that restores the rest (the envs' replay included) may move them
        torch.set_rng_state(tensors[f"rank{rank}/rng/torch"])
        self.shuffle.set_state(tensors[f"rank{rank}/rng/shuffle"])
        for key, value in tensors.items():
            if key.startswith(f"rank{rank}/rng/cuda/"):
                torch.cuda.set_rng_state(value, int(key.rpartition("/")[2]))
        if "sync_check" in saved[rank]:     # a checkpoint written before it kept the check's rows measures afresh
            self.sync_check.load_state_dict(saved[rank]["sync_check"])
        py_version, py_state, py_gauss = saved[rank]["python_random"]
        random.setstate((py_version, tuple(py_state), py_gauss))
        np_name, np_keys, np_pos, np_has_gauss, np_gauss = saved[rank]["numpy_random"]
        np.random.set_state((np_name, np.array(np_keys, dtype=np.uint32), np_pos, np_has_gauss, np_gauss))
        return meta["iteration"]

    def _trained(self) -> list[tuple[str, torch.nn.Module, torch.optim.Optimizer]]:
        """(name, network, its optimizer) of the actor and, in a PPO run, the critic."""
        return [("actor", self.actor, self.actor_opt)] + ([] if self.critic is None else
                                                           [("critic", self.critic, self.critic_opt)])

    def _stepped(self) -> set[str]:
        """The optimizers ("actor_opt", "critic_opt") that have stepped. One that has not (the actor's after a
        critic warmup) has no state to save, and reading it would give it one: get_state_dict steps it once."""
        return {f"{name}_opt" for name, _, optimizer in self._trained() if optimizer.state}

    def _networks(self, stepped: set[str]) -> dict:
        """The networks' state dicts and those of the optimizers in `stepped`, keyed by parameter name (DCP
        reshards them)."""
        state = {}
        for name, model, optimizer in self._trained():
            if f"{name}_opt" in stepped:
                state[name], state[f"{name}_opt"] = get_state_dict(model, optimizer)
            else:
                state[name] = get_model_state_dict(model)
        return state

    def _rank_state(self) -> tuple[dict[str, torch.Tensor], dict]:
        """This rank's RNG tensors, and its collector's, served-policy check's and python/numpy RNG states
        (JSON-able)."""
        tensors = {"rng/torch": torch.get_rng_state(), "rng/shuffle": self.shuffle.get_state()}
        if torch.cuda.is_initialized():   # else no CUDA generator has drawn yet
            tensors.update({f"rng/cuda/{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
        py_version, py_state, py_gauss = random.getstate()
        np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
        meta = {"collector": self.collector.state_dict(), "sync_check": self.sync_check.state_dict(),
                "python_random": [py_version, list(py_state), py_gauss],
                "numpy_random": [np_name, np_keys.tolist(), np_pos, np_has_gauss, np_gauss]}
        return tensors, meta


def collector_share(collector: Collector, saved: list[dict], ranks: Ranks) -> dict:
    """This rank's collector state from every saved rank's: the env streams of all of them, in order,
    cut into this rank's share (a fixed-turn collector); else the state of saved rank 0 (a group
    collector's next seed, the same on every rank)."""
    if "streams" not in saved[0]:
        return saved[0]
    streams = [stream for state in saved for stream in state["streams"]]
    return {"streams": [streams[i] for i in ranks.share(len(streams))]}


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The run's complete checkpoint folders, oldest first (a `.tmp` folder is not one)."""
    folders = [p for p in (run_dir / runfolder.CHECKPOINTS).glob("iter_*") if _ITERATION_FOLDER.fullmatch(p.name)]
    return sorted(folders)


class StopSignals:
    """While active, the first SIGINT or SIGTERM only records its number in `signum` (the loop saves a
    checkpoint and stops at the next iteration boundary, see `Checkpointer`); a second one aborts at
    once with KeyboardInterrupt. The previous handlers come back on exit. Handlers can only be set in
    the main thread; elsewhere this does nothing.

    What runs before the first checkpoint (the warm start, the critic warmup) has nothing to save: it
    runs `within(phase)` and calls `check` between its steps (seconds apart at most), which ends it with
    StoppedBeforeCheckpoint once a signal has come, as does the end of the phase."""

    def __init__(self):
        self.signum: int | None = None
        self.phase: str | None = None      # what runs before the first checkpoint, e.g. "the warm start"
        self._run_dir: Path | None = None
        self._ranks = LOCAL
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

    @contextmanager
    def within(self, phase: str, run_dir: Path | None = None, ranks: Ranks = LOCAL) -> Iterator[None]:
        """`phase` (e.g. "the warm start") runs inside, on `ranks` (every one of them enters it), in the run
        folder `run_dir` (None: not made yet); a signal is told to stop it. A phase that ends with a signal
        come raises StoppedBeforeCheckpoint, as `check` does."""
        self.phase, self._run_dir, self._ranks = phase, run_dir, ranks
        try:
            yield
            self.check()
        finally:
            self.phase, self._run_dir, self._ranks = None, None, LOCAL

    def check(self) -> None:
        """Inside `within`: raise StoppedBeforeCheckpoint once a signal has come (on every rank when one
        reached any: they agree with Ranks.max)."""
        signum = self._ranks.max(self.signum or 0)
        if signum:
            raise StoppedBeforeCheckpoint(signum, self.phase, self._run_dir)

    def _handle(self, signum: int, frame) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum
        name = signal.Signals(signum).name
        if self.phase is not None:
            log.warning("%s: stopping %s within seconds, with nothing saved (no checkpoint yet)", name, self.phase)
        else:
            log.warning("%s: saving a checkpoint after this iteration, then stopping (send it again to abort at "
                        "once)", name)


class Checkpointer:
    """When to save the TrainingState: after every `save_every`-th iteration (0: never on a schedule) and after
    the iteration that ends the run (the loop says which: the last of `iterations`, the one that spent the
    budget, the first boundary after a stop signal). It saves and says where; it stops nothing (the loop does).
    `signals`: the run's stop signals, which the phases before the first checkpoint check."""

    def __init__(self, run_dir: Path, state: TrainingState, cfg: TrainConfig, signals: StopSignals):
        self.run_dir, self.state, self.signals, self.save_every = run_dir, state, signals, cfg.save_every

    def save_if_due(self, iteration: int, ends_run: bool) -> Path | None:
        """The checkpoint folder saved after `iteration` (its records written, the engine holding the new
        weights), or None when none was due."""
        scheduled = self.save_every > 0 and iteration > 0 and iteration % self.save_every == 0
        if not (scheduled or ends_run):
            return None
        return self.state.save(self.run_dir, iteration)


@dataclass(frozen=True)
class ResumePoint:
    """Where `--resume` continues a run: its last complete checkpoint."""

    run_dir: Path
    folder: Path


def resume_config(run_dir: Path, overrides: list[str] = ()) -> TrainConfig:
    """The run's config.yaml with `overrides` of RESUMABLE_KEYS only. It only reads: under torchrun every
    rank calls it before the process group exists, and rank 0 alone records the overrides in config.yaml
    (`prepare_resume`), so that a later resume sees them too."""
    path = Path(run_dir) / runfolder.CONFIG
    if not path.is_file():
        raise CheckpointError(f"{run_dir} is not a run folder (no config.yaml)")
    changed = [o.partition("=")[0].strip() for o in overrides]
    refused = [key for key in changed if key not in RESUMABLE_KEYS]
    if refused:
        raise ConfigError(f"--resume continues a run with its own config.yaml; only {', '.join(RESUMABLE_KEYS)} "
                          f"can be changed (got {', '.join(refused)})")
    return load_config(path, overrides, run_folder=True)


def prepare_resume(run_dir: Path, cfg: TrainConfig) -> ResumePoint:
    """The run's last complete checkpoint; removes leftover `.tmp` folders of a crashed write, cuts
    metrics.jsonl and trajectories.jsonl back to the checkpoint's iteration (the records of later
    iterations, which the resumed run writes again, and a torn last line) and, once the checkpoint
    fits `cfg`, writes `cfg` (the resume's overrides included) into config.yaml. Called by one process
    only (rank 0 under torchrun), which alone changes the run folder."""
    run_dir = Path(run_dir)
    for leftover in (run_dir / runfolder.CHECKPOINTS).glob("*.tmp"):
        shutil.rmtree(leftover)
    folders = complete_checkpoints(run_dir)
    if not folders:
        raise CheckpointError(f"{run_dir} has no complete checkpoint in {run_dir / runfolder.CHECKPOINTS} (it stopped "
                              "before saving one)")
    folder = folders[-1]
    missing = [name for name in (f"{DCP_FOLDER}/.metadata", "training_state.json", "training_state.safetensors")
               if not (folder / name).is_file()]
    if missing:
        raise CheckpointError(f"{folder} is incomplete: {', '.join(missing)} missing")
    if cfg.model.path is None and not (run_dir / runfolder.INIT).is_dir():
        raise CheckpointError(f"{run_dir / 'init'} (the initial policy, the reference) is missing")
    iteration = int(_ITERATION_FOLDER.fullmatch(folder.name).group(1))
    if iteration > cfg.iterations:
        raise CheckpointError(f"{folder} is past iterations={cfg.iterations}; resume with iterations=N, "
                              f"N >= {iteration}")
    for name in (runfolder.METRICS, runfolder.TRAJECTORIES):
        keep_records_through(run_dir / name, iteration)
    resolved = dump(cfg)
    if (run_dir / runfolder.CONFIG).read_text(encoding="utf-8") != resolved:
        write_text_atomic(run_dir / runfolder.CONFIG, resolved)
    return ResumePoint(run_dir, folder)


def keep_records_through(path: Path, iteration: int) -> None:
    """Keep the JSON lines of `path` (records in iteration order, each with an "iteration") up to
    `iteration`, and none after a torn line."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            break
        if not line.endswith("\n") or record["iteration"] > iteration:
            break
        kept.append(line)
    write_text_atomic(path, "".join(kept))


def initial_policy_path(cfg: TrainConfig, run_dir: Path) -> str:
    """Where the run's initial policy (its reference) is: `init/` (tiny model) or `model.path`."""
    return str(run_dir / runfolder.INIT) if cfg.model.path is None else cfg.model.path
