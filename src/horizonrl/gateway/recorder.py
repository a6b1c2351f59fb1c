"""What the gateway served, call by call: the exact token ids an agent's rollout was sampled as.

Each choice of each model call becomes a `Call`. Calls on a rollout URL (`/rollouts/<id>/v1/...`) are
kept under their rollout until the trainer `take`s it; every call (plain /v1 routes included) and
every posted reward is also one JSON line of the traces file, written and flushed as it happens.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Call:
    """One choice of one model call: exactly what the engine was given and sampled."""

    rollout_id: str | None          # None: a call on the plain /v1 routes
    index: int                      # order of the call within its rollout (0, 1, ...); choices of one request
                                    # get consecutive indices
    messages: list[dict] | None     # chat: the normalised messages rendered; completions: None
    tools: list[dict] | None
    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float] | None
    finish_reason: str              # "stop" | "length" | "tool_calls" (as returned to the client)
    response: dict                  # the message (chat) or {"text": ...} (completions) returned to the client
    weights_version: int | None
    started: float                  # time.time() when the request arrived
    finished: float
    tool_call_parse_failed: bool = False   # a <tool_call> block did not parse: the text came back as content
    reward: float | None = None     # a per-call reward posted to /rollouts/<id>/reward
    agent: str | None = None        # the agent whose URL it came on (/rollouts/<id>/agents/<agent>/v1); None: none


@dataclass
class Rollout:
    rollout_id: str
    calls: list[Call] = field(default_factory=list)
    reward: float | None = None     # posted {"reward": x}
    agent_rewards: dict[str, float] = field(default_factory=dict)   # posted to /rollouts/<id>/agents/<agent>/reward


class Recorder:
    """The calls of each rollout, in call order, until taken; and the traces file (one JSON object a line:
    `{"event": "call", <the Call's fields>}` or `{"event": "reward", "rollout_id", "reward", "call_rewards"}`).

    `issued_only=False` accepts calls under any rollout id not yet taken; `issued_only=True` (training)
    only under ids the trainer `issue`d and has not taken yet, so an agent cannot add calls to a rollout
    after it was handed to the learner. A lock guards every method: the gateway's event loop records
    while the trainer, in another thread, issues and takes rollouts.
    """

    def __init__(self, traces: Path | None = None, issued_only: bool = False):
        self.issued_only = issued_only
        self._lock = threading.Lock()
        self._rollouts: dict[str, Rollout] = {}
        self._issued: set[str] = set()
        self._taken: set[str] = set()
        self._plain_calls = 0  # calls recorded on the plain /v1 routes: their indices
        self._traces = open(traces, "a", encoding="utf-8") if traces is not None else None  # noqa: SIM115

    def issue(self, rollout_id: str) -> None:
        """A rollout id the trainer hands to an agent: calls under it are accepted until it is taken."""
        with self._lock:
            self._issued.add(rollout_id)
            self._taken.discard(rollout_id)

    def accepts(self, rollout_id: str) -> bool:
        with self._lock:
            return rollout_id not in self._taken and (not self.issued_only or rollout_id in self._issued)

    def next_index(self, rollout_id: str | None) -> int:
        """The index the next call recorded under `rollout_id` gets."""
        with self._lock:
            if rollout_id is None:
                return self._plain_calls
            rollout = self._rollouts.get(rollout_id)
            return len(rollout.calls) if rollout is not None else 0

    def record(self, call: Call) -> None:
        """Append `call` to its rollout (unless it has none, or was taken meanwhile: then the trace alone
        has it) and write its trace line."""
        with self._lock:
            if call.rollout_id is None:
                self._plain_calls += 1
            elif call.rollout_id not in self._taken:
                self._rollouts.setdefault(call.rollout_id, Rollout(call.rollout_id)).calls.append(call)
            if self._traces is not None:   # a shallow dict: asdict's deep copies cost ~1 ms a call
                self._trace({"event": "call", **{f.name: getattr(call, f.name) for f in dataclasses.fields(call)}})

    def set_reward(self, rollout_id: str, reward: float | None = None,
                   call_rewards: dict[int, float] | None = None, agent: str | None = None) -> None:
        """The rollout's reward (`agent`'s, with an agent) and/or rewards of its calls by index (KeyError naming an
        index it has no call at)."""
        with self._lock:
            rollout = self._rollouts.setdefault(rollout_id, Rollout(rollout_id))
            missing = sorted(set(call_rewards or {}) - set(range(len(rollout.calls))))
            if missing:
                raise KeyError(f"rollout {rollout_id} has {len(rollout.calls)} calls; no call at index {missing}")
            for index, value in (call_rewards or {}).items():
                rollout.calls[index].reward = value
            if agent is not None:
                rollout.agent_rewards[agent] = reward
            elif reward is not None:
                rollout.reward = reward
            self._trace({"event": "reward", "rollout_id": rollout_id, "reward": reward, "agent": agent,
                         "call_rewards": {str(k): v for k, v in (call_rewards or {}).items()}})

    def take(self, rollout_id: str) -> Rollout:
        """Remove and return the rollout (an empty one if it made no call); the id is no longer accepted."""
        with self._lock:
            self._issued.discard(rollout_id)
            self._taken.add(rollout_id)
            return self._rollouts.pop(rollout_id, None) or Rollout(rollout_id)

    def close(self) -> None:
        with self._lock:
            if self._traces is not None:
                self._traces.close()
                self._traces = None

    def _trace(self, line: dict) -> None:
        if self._traces is not None:
            self._traces.write(json.dumps(line) + "\n")
            self._traces.flush()
