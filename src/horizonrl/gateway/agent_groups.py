"""Agents we did not write (`task.agent`, OpenAI API clients) as group rollouts: `GroupCollector(GatewayAgents(...),
n_tasks, group_size)` (rollout/groups.py).

Each of `n_tasks` tasks is given to `group_size` agents at once, `await agent(task, base_url)` with
`task` the Task as a dict (task_id, seed, messages, data) and `base_url` its own rollout URL on the
gateway, `<gateway>/rollouts/<rollout id>/v1`. The gateway (horizonrl.gateway) records every call made
there: the exact prompt ids the chat template gave, the sampled ids and their log-probs. A rollout's
calls, in the order they arrived, are its episode's turns (`episode_from_rollout`), so the samples code
merges them into one row where each prompt extends the previous prompt + response, and splits (and
classifies the break) where the agent re-rendered its history.

The outcome reward is the number the agent returned; else the reward it posted to
`/rollouts/<id>/reward`; else `reward_fn(episode)` when the run has one (group.reward_fn). Per-call
rewards posted there become the turns' rewards (GiGPO's step rewards). An agent that raises, runs past
`timeout_s`, never calls the model or ends with no reward is counted in `errors` (its cause, e.g. "agent
raised BadRequestError: ..."; each logged at DEBUG, the batch's summarised in one warning by cause,
rollout/failures.py); its episode carries the same cause in `metrics["error"]`, so the group estimators
leave it out of its group: never a silent 0. A batch's counts are what the gateway counted during it
(`gateway/<name>` for each of its `stats`: requests, errors, server_errors, ...).

Several agents in one program (`task.agents`: their names): each agent's client uses its own URL,
`agent_url(base_url, name)` = `<rollout URL minus /v1>/agents/<name>/v1`, so each call is recorded as that
agent's; each agent's reward is the `{name: reward}` the program returned, else what it posted to
`/rollouts/<id>/agents/<name>/reward`. The episode's turns then carry their agent's seat (its index in
`task.agents`) and its last turn every agent's reward (`seat_returns`): the collector makes one episode per
agent (rollout/seats.py), grouped by task and agent, so each agent's calls are its own samples and credit.
A call on the rollout's own URL, an agent not declared, or one without a reward, drops the rollout.

The agents share one event loop, so an agent that blocks it (a synchronous client such as `openai.OpenAI`
inside `async def`) makes every rollout of the batch wait for its calls. Each step of an agent (its code
between two awaits) is timed; a batch whose steps of over `LONG_STEP_S` add up to over `BLOCKED_SHARE` of
its time (and over a second) is logged, once per run, naming the likely cause. A one-off stall (an import
on the first call) is not. The loop's own lateness would not do: the gateway's thread (the engine) holds
the GIL for much of the time, which delays the loop without any agent blocking it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import asdict, replace

from horizonrl.engines.base import Engine, Generation, SamplingParams
from horizonrl.envs.base import state_digest
from horizonrl.gateway.recorder import Rollout
from horizonrl.gateway.server import Gateway, GatewayThread
from horizonrl.records import Episode, Task, Turn
from horizonrl.rollout.episode_groups import RewardFn

log = logging.getLogger(__name__)
AgentFn = Callable[[dict, str], Awaitable[float | dict[str, float] | None]]
LONG_STEP_S = 0.5      # an agent's step (its code between two awaits) this long blocks the others
BLOCKED_SHARE = 0.5    # of a batch's time, in long steps: reported


class RunSampling:
    """The engine a training run's gateway samples from: `engine` at the run's temperature and top_p on every
    call, whatever the agent asked (the learner scores the sampled ids at them; a different value would bias
    every ratio). The first call that asked otherwise is logged."""

    def __init__(self, engine: Engine, temperature: float, top_p: float):
        self.engine, self.temperature, self.top_p = engine, temperature, top_p
        self.overridden = False

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        if (params.temperature, params.top_p) != (self.temperature, self.top_p) and not self.overridden:
            self.overridden = True
            log.warning("an agent asked for temperature %s, top_p %s; training samples at the run's %s, %s",
                        params.temperature, params.top_p, self.temperature, self.top_p)
        return await self.engine.generate(prompt_ids, replace(params, temperature=self.temperature, top_p=self.top_p))


def agent_url(base_url: str, agent: str) -> str:
    """The URL of `agent` in the rollout whose URL is `base_url` (`.../rollouts/<id>/v1`): its calls are its own."""
    return f"{base_url.removesuffix('/v1')}/agents/{agent}/v1"


def episode_from_rollout(rollout: Rollout, episode_id: str, task: Task, group_id: str | None) -> Episode:
    """One turn per recorded call, in call order: its exact ids and log-probs, its posted reward (0 if none)
    and, as info, the text and message returned; the last turn ended the episode (the agent stopped there).
    A turn's state is its whole prompt (GiGPO anchors: calls of one task with equal prompts)."""
    turns = [Turn(list(call.prompt_ids), list(call.response_ids), call.response_logprobs,
                  reward=call.reward or 0.0, state_key=state_digest(*call.prompt_ids),
                  info={"text": response_text(call.response), "response": call.response,
                        "finish_reason": call.finish_reason, "weights_version": call.weights_version,
                        "call": call.index, "generate_s": call.finished - call.started,
                        "tool_call_parse_failed": call.tool_call_parse_failed, "agent": call.agent})
             for call in rollout.calls]
    if turns:
        turns[-1].terminated = True
    return Episode(episode_id, task.task_id, task.seed, group_id, turns, data=dict(task.data))


def waited_for_a_core_s() -> float:
    """Seconds this thread has been runnable but not running so far (Linux's schedstat); 0 where the kernel does
    not say. Such a wait is the machine's load, not the agent blocking its loop."""
    try:
        with open("/proc/thread-self/schedstat") as stats:
            return int(stats.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


class LongSteps:
    """`await LongSteps(coro, blocked)` awaits `coro`, timing each of its steps (one `send` or `throw`: its
    code up to its next await, less what the thread waited for a core meanwhile: a busy machine is not a
    blocking agent) and adding those over LONG_STEP_S to `blocked[0]`."""

    def __init__(self, coro: Coroutine, blocked: list[float]):
        if not inspect.iscoroutine(coro):
            raise TypeError(f"task.agent must be an `async def` function: it returned {type(coro).__name__}, "
                            "not a coroutine")
        self.coro, self.blocked = coro, blocked

    def __await__(self):
        value, error = None, None
        while True:
            started, queued = time.monotonic(), waited_for_a_core_s()
            try:
                awaited = self.coro.send(value) if error is None else self.coro.throw(error)
            except StopIteration as done:
                return done.value
            finally:
                self._count(time.monotonic() - started - (waited_for_a_core_s() - queued))
            try:
                value, error = (yield awaited), None
            except BaseException as thrown:          # cancellation (a timeout) goes on into the agent
                value, error = None, thrown

    def _count(self, step_s: float) -> None:
        if step_s > LONG_STEP_S:
            self.blocked[0] += step_s


def finite_number(value) -> bool:
    """Whether an agent's reward is a finite int or float (a bool is no reward)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def response_text(response: dict) -> str:
    """The text a call returned: a chat message's content ("" when it only called tools), a completion's text."""
    return response.get("content") or response.get("text") or ""


class GatewayAgents:
    """The player (rollout/groups.py) of the user's agents through the gateway: task j of a batch is
    `make_task(seed)`."""

    failures = "of {rollouts} rollouts dropped from their groups"

    def __init__(self, agent: AgentFn, make_task: Callable[[int], Task], gateway: Gateway,
                 reward_fn: RewardFn | None = None, timeout_s: float = 300.0, agents: tuple[str, ...] = ()):
        """`gateway`: serves the engine, with a Recorder that accepts only the rollout ids issued here; it runs
        in a thread of its own from the first batch until `close`. `agents`: the names of a program's agents
        (module docstring); none: one agent."""
        self.agent, self.make_task, self.gateway, self.reward_fn = agent, make_task, gateway, reward_fn
        self.agents = agents
        self.timeout_s = timeout_s
        self.block_reported = False
        self._server: GatewayThread | None = None
        self._base_url = ""
        self._blocked = [0.0]     # the batch's agents' long steps, in seconds (LongSteps)

    def task(self, j: int, seed: int) -> Task:
        return self.make_task(seed)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """The gateway served (from the first batch on); a batch (or, in asynchronous training, a run's overlapping
        batches) whose agents blocked their event loop for most of its time reported (once per run). When the
        batch ends no model call of its rollouts is in flight: a call an agent gave up on (a timeout) was
        awaited to its end."""
        if self._server is None:
            self._server = GatewayThread(self.gateway)
            self._base_url = self._server.start()
        self._blocked, started = [0.0], time.monotonic()
        yield
        elapsed = time.monotonic() - started
        if self._blocked[0] > max(1.0, BLOCKED_SHARE * elapsed) and not self.block_reported:
            self.block_reported = True
            log.warning("the agents blocked their event loop for %.1f s of the batch's %.1f s: an agent runs "
                        "blocking code inside `async def`, e.g. openai.OpenAI where openai.AsyncOpenAI is needed, "
                        "so the batch's rollouts wait for each other (reported once per run)", self._blocked[0],
                        elapsed)

    def counters(self) -> dict[str, int]:
        """What the gateway has counted, as `gateway/<name>`: requests, errors, server_errors, ..."""
        return {f"gateway/{name}": n for name, n in self.gateway.stats.items()}

    def close(self) -> None:
        """Stop the gateway (it waits for the calls in flight)."""
        if self._server is not None:
            self._server.stop()
            self._server = None

    async def play(self, task: Task, k: int, errors: list[str]) -> Episode:
        """Agent k on `task`, on its own rollout URL; a failure (it raised, timed out, made no call, gave no
        reward) is dropped from its group with the cause in metrics["error"] and `errors`."""
        rollout_id = f"seed{task.seed}-r{k}"                   # URL-safe, unique over the run's batches
        self.gateway.recorder.issue(rollout_id)
        failure, returned = None, None
        try:
            agent = self.agent(asdict(task), f"{self._base_url}/rollouts/{rollout_id}/v1")
            returned = await asyncio.wait_for(LongSteps(agent, self._blocked), self.timeout_s)
        except asyncio.TimeoutError:
            failure = f"timed out after {self.timeout_s} s"
        except Exception as error:                              # the agent's own bug or its client's error
            failure = f"raised {type(error).__name__}: {error}"
        rollout = self.gateway.recorder.take(rollout_id)
        await self._server.calls_over(rollout_id)
        episode = episode_from_rollout(rollout, f"{task.task_id}/rollout{k}", task, task.task_id)
        if failure is None and self.agents:
            failure, returned = self._agents_outcome(episode, returned, rollout.agent_rewards)
        if failure is None:
            failure, reward = self._outcome(episode, returned, rollout.reward)
        if failure is not None:
            errors.append(f"agent {failure}")
            log.debug("%s dropped from its group: the agent %s", episode.episode_id, failure)
            episode.metrics = {"error": errors[-1]}
            return episode
        episode.outcome_reward = reward
        episode.metrics = {"return": reward, "length": len(episode.turns), "success": float(reward > 0)}
        return episode

    def _agents_outcome(self, episode: Episode, returned, posted: dict[str, float]) -> tuple[str | None, float]:
        """A program of several agents: (None, the first caller's reward) with each turn's seat its agent's and
        the last turn's `seat_returns` every agent's reward (0 for one that made no call); or (why it is
        dropped, None)."""
        rewards = returned if isinstance(returned, dict) else posted
        for turn in episode.turns:
            if turn.info["agent"] not in self.agents:
                return (f"called the model as agent {turn.info['agent']!r}; task.agents declares "
                        f"{', '.join(self.agents)} (each calls on agent_url(base_url, name))"), None
            turn.seat = self.agents.index(turn.info["agent"])
        callers = list(dict.fromkeys(turn.info["agent"] for turn in episode.turns))
        missing = [name for name in callers if name not in rewards]
        if missing:
            return (f"gave no reward to agent {', '.join(missing)} (return {{name: reward}} or post to "
                    "/rollouts/<id>/agents/<name>/reward)"), None
        for name in callers:
            if not finite_number(rewards[name]):
                return f"gave agent {name} a reward that is not a finite number: {rewards[name]!r}", None
        if episode.turns:
            episode.turns[-1].info["seat_returns"] = [float(rewards.get(name, 0.0)) for name in self.agents]
        return None, rewards[callers[0]] if callers else None

    def _outcome(self, episode: Episode, returned, posted: float | None) -> tuple[str | None, float | None]:
        """(None, the episode's outcome reward), or (why it is dropped, None)."""
        if not episode.turns:
            return "made no model call", None
        reward = returned if returned is not None else posted
        if reward is None and self.reward_fn is not None:
            reward = self.reward_fn(episode)
        if reward is None:
            return "returned no reward and posted none", None
        if not finite_number(reward):
            return f"returned a reward that is not a finite number: {reward!r}", None
        return None, float(reward)
