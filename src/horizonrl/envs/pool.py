"""Async env handles for the collector: in-process, or one worker process per env stream.

Both kinds expose what the agent reads (`actions`, `default_action`, `translations`, `instruction`, and a game's
`seat`: None for an env without seats),
`state_key` (the env's state_key() after the last reset or step; None for an env without one) and
`async reset(seed)` / `async step(action)`. A call that raises, or that has not answered after
`timeout_s` (worker processes only), raises `EnvError` after the handle has rebuilt its env (a new
worker process), so the stream can go on with a fresh episode. `errors` counts these recoveries.

Worker processes keep a slow env (Crafter's ~1 s world generation) off the event loop that feeds
the engine; they are started with `spawn`, so they never inherit the learner's threads or CUDA state.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import traceback
from typing import Any

from horizonrl import envs as registry
from horizonrl.envs.base import Instruction, has_state_key


class EnvError(RuntimeError):
    """An env call failed or hung; the handle has already been rebuilt."""


def env_view(env) -> tuple[list[str], str, dict[str, str], Instruction, int | None]:
    """What the agent needs to read from an env, refreshed after every call (it may change)."""
    return list(env.actions), env.default_action, dict(env.translations), env.instruction, getattr(env, "seat", None)


def state_of(env) -> str | None:
    """The env's state_key() (None for an env that has none; only GiGPO needs it)."""
    return env.state_key() if has_state_key(env) else None


class InProcessEnv:
    """Calls the env directly on the event loop; cheap for fast envs, no hang protection."""

    def __init__(self, env_id: str, kwargs: dict):
        self.env_id, self.kwargs = env_id, kwargs
        self.env = registry.make(env_id, **kwargs)
        self.errors = 0
        self.state_key: str | None = None
        self._refresh()

    def _refresh(self) -> None:
        self.actions, self.default_action, self.translations, self.instruction, self.seat = env_view(self.env)

    async def reset(self, seed: int) -> tuple[str, dict]:
        return self._call("reset", seed)

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        return self._call("step", action)

    def _call(self, method: str, argument: Any):
        try:
            result = getattr(self.env, method)(argument)
        except Exception as error:
            self.errors += 1
            self.env = registry.make(self.env_id, **self.kwargs)
            self._refresh()
            raise EnvError(f"{self.env_id} {method}({argument!r}) raised {type(error).__name__}: {error}") from error
        self._refresh()
        self.state_key = state_of(self.env)
        return result

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if close:
            close()


class WorkerEnv:
    """The env lives in its own process; calls are messages over a pipe, awaited without threads."""

    def __init__(self, env_id: str, kwargs: dict, timeout_s: float = 60.0, wait: bool = True):
        self.env_id, self.kwargs, self.timeout_s = env_id, kwargs, timeout_s
        self.errors = 0
        self.state_key: str | None = None
        self._launch()
        if wait:
            self.wait_ready()

    def _launch(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        args = (child, self.env_id, registry.spec(self.env_id), self.kwargs)
        self.process = context.Process(target=_serve, args=args, daemon=True)
        self.process.start()
        child.close()

    def wait_ready(self) -> None:
        """Block until the worker has built its env (the first message: built, or why not)."""
        try:
            status, payload, view = self.conn.recv()
        except EOFError:
            status, payload, view = "error", f"worker exited with code {self.process.exitcode}", None
        if status != "ok":
            self._stop()
            raise ValueError(f"env {self.env_id!r} could not be built in a worker: {payload}")
        self.actions, self.default_action, self.translations, self.instruction, self.seat = view

    async def reset(self, seed: int) -> tuple[str, dict]:
        return await self._call("reset", seed)

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        return await self._call("step", action)

    async def _call(self, method: str, argument: Any):
        try:
            self.conn.send((method, argument))
            await self._readable(self.timeout_s)
            status, payload, view = self.conn.recv()
        except (TimeoutError, EOFError, OSError) as error:
            problem = (f"no answer after {self.timeout_s:g} s" if isinstance(error, TimeoutError)
                       else f"worker died ({type(error).__name__})")
            self._restart()
            raise EnvError(f"{self.env_id} {method}({argument!r}): {problem}") from None
        if status != "ok":
            self._restart()
            raise EnvError(f"{self.env_id} {method}({argument!r}) raised {payload}")
        self.actions, self.default_action, self.translations, self.instruction, self.seat = view
        result, self.state_key = payload
        return result

    async def _readable(self, timeout_s: float) -> None:
        loop, ready = asyncio.get_running_loop(), asyncio.Event()
        fd = self.conn.fileno()
        loop.add_reader(fd, ready.set)
        try:
            await asyncio.wait_for(ready.wait(), timeout_s)
        finally:
            loop.remove_reader(fd)

    def _restart(self) -> None:
        self.errors += 1
        self._stop()
        self._launch()
        self.wait_ready()

    def _stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()

    def close(self) -> None:
        if self.process.is_alive():
            try:
                self.conn.send(("close", None))
            except OSError:
                pass
            self.process.join(timeout=5)
        self._stop()


def _serve(conn, env_id: str, env_spec: registry.EnvSpec, kwargs: dict) -> None:
    """Worker process: build the env, then answer (method, argument) messages until told to close.
    The spec travels with the call, so envs registered at run time in the parent work here too."""
    registry.REGISTRY[env_id] = env_spec
    # The parent decides when the env stops: a SIGINT or SIGTERM sent to the whole process group (Ctrl-C
    # in a terminal, a batch scheduler) lets the run finish its iteration and save a checkpoint first.
    # A parent that dies anyway ends the worker (its pipe closes).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        env = registry.make(env_id, **kwargs)
    except Exception as error:
        conn.send(("error", f"{type(error).__name__}: {error}", None))
        return
    conn.send(("ok", None, env_view(env)))
    while True:
        method, argument = conn.recv()
        if method == "close":
            getattr(env, "close", lambda: None)()
            return
        try:
            result = getattr(env, method)(argument)
            conn.send(("ok", (result, state_of(env)), env_view(env)))
        except Exception as error:
            conn.send(("error", f"{type(error).__name__}: {error}\n{traceback.format_exc(limit=3)}", None))


def open_envs(env_ids: str | list[str], kwargs: dict, n: int, workers: bool, timeout_s: float,
              first: int = 0) -> list:
    """n env handles for streams first..first+n-1, handle i of env_ids[(first + i) % len(env_ids)], each
    in its own worker process when `workers`, else in this process."""
    env_ids = [env_ids] if isinstance(env_ids, str) else env_ids
    ids = [env_ids[(first + i) % len(env_ids)] for i in range(n)]
    if workers:
        handles = [WorkerEnv(env_id, kwargs, timeout_s, wait=False) for env_id in ids]  # build in parallel
        for handle in handles:
            handle.wait_ready()
        return handles
    return [InProcessEnv(env_id, kwargs) for env_id in ids]
