"""The agent loop for tool use and interactions: one episode as an explicit state machine (verl's
AgentLoop), one small function per state.

    PENDING -> GENERATING -> PROCESSING_TOOLS -> GENERATING -> ...
                         -> INTERACTING      -> GENERATING -> ...
                         -> TERMINATED

Every response is one Turn. `Trajectory.ids` is the whole conversation in token ids: the first
prompt, then each sampled response followed by its feedback (tool responses, interaction text) as
observation ids. A turn's prompt is `ids` at the moment it is sampled, so each prompt extends the
previous prompt + response exactly and the episode merges into one training row with no split.

Feedback enters as new messages through the chat template (`feedback="new_round"`: tool results as
`tool` messages, interaction text as a `user` message) or inside the assistant message, which the
model continues (`feedback="continuation"`: responses then stop right after `</tool_call>`; a response
that closed its message with EOS gets its feedback as a new round).

Budgets: `params.max_tokens` per response, `max_total_tokens` for everything after the first prompt
(responses and feedback), `max_turns` responses. Reaching one ends the episode as truncated; the
reason is recorded in `Episode.metrics["stop_reason"]` ("answered", "interaction", "max_tokens",
"max_total_tokens" or "max_turns"); a truncated episode's bootstrap prompt is the conversation so far.
"""

from __future__ import annotations

import enum
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from horizonrl.agents.agent import chat_prompt_ids, new_round_ids
from horizonrl.engines.base import Engine, SamplingParams
from horizonrl.engines.retry import generate_with_retry
from horizonrl.envs.base import state_digest
from horizonrl.records import Episode, Task, Turn
from horizonrl.rollout.interaction import Interaction
from horizonrl.tools.calls import (CLOSE_TAG, ToolCall, ToolResult, format_tool_response, parse_tool_calls,
                                   run_tool_calls, truncate_to_tokens)
from horizonrl.tools.registry import Tool


class State(enum.Enum):
    PENDING = "pending"
    GENERATING = "generating"
    PROCESSING_TOOLS = "processing_tools"
    INTERACTING = "interacting"
    TERMINATED = "terminated"


@dataclass
class Trajectory:
    """One episode in progress: token ids, the same conversation as text messages (for interactions
    and schedulers), the turns so far, and the tool calls waiting to run."""

    task: Task
    interaction: Interaction | None = None
    ids: list[int] = field(default_factory=list)
    prompt_length: int = 0
    messages: list[dict] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    calls: list[ToolCall | ToolResult] = field(default_factory=list)
    stop_reason: str | None = None


@dataclass
class AgentLoop:
    """What an episode runs with: the engine and its sampling params, the tools, an interaction per
    episode (`interaction_factory`, optional), the feedback mode and the budgets."""

    tokenizer: object
    engine: Engine
    params: SamplingParams
    tools: dict[str, Tool] = field(default_factory=dict)
    interaction_factory: Callable[[], Interaction] | None = None
    feedback: str = "new_round"
    max_turns: int = 8
    max_total_tokens: int = 2048
    max_parallel_calls: int = 4
    tool_timeout_s: float = 10.0
    max_tool_response_tokens: int = 256

    def __post_init__(self):
        if self.feedback == "continuation" and self.tools:
            stop = re.escape(CLOSE_TAG)
            self.params = replace(self.params, stop_patterns=tuple(dict.fromkeys((*self.params.stop_patterns, stop))))

    async def run(self, task: Task, episode_id: str, group_id: str | None = None) -> Episode:
        trajectory = Trajectory(task, self.interaction_factory() if self.interaction_factory else None)
        state = State.PENDING
        while state is not State.TERMINATED:
            state = await STEPS[state](self, trajectory)
        return to_episode(trajectory, episode_id, group_id)


async def pending(loop: AgentLoop, trajectory: Trajectory) -> State:
    """The first prompt: the task's messages and the tool schemas through the chat template."""
    if trajectory.interaction is not None:
        await trajectory.interaction.start(trajectory.task)
    schemas = [tool.schema for tool in loop.tools.values()] or None
    trajectory.messages = [dict(m) for m in trajectory.task.messages]
    trajectory.ids = chat_prompt_ids(loop.tokenizer, trajectory.messages, schemas)
    trajectory.prompt_length = len(trajectory.ids)
    return State.GENERATING


async def generating(loop: AgentLoop, trajectory: Trajectory) -> State:
    """Sample one response within the budgets; its tool calls, if any, go to PROCESSING_TOOLS."""
    if len(trajectory.turns) >= loop.max_turns:
        return terminate(trajectory, "max_turns")
    room = loop.max_total_tokens - (len(trajectory.ids) - trajectory.prompt_length)
    if room <= 0:
        return terminate(trajectory, "max_total_tokens")
    params = replace(loop.params, max_tokens=min(loop.params.max_tokens, room))
    started = time.perf_counter()
    generation, retries = await generate_with_retry(loop.engine, list(trajectory.ids), params)
    text = loop.tokenizer.decode(generation.token_ids, skip_special_tokens=True)
    info = {"text": text, "finish_reason": generation.finish_reason, "generate_s": time.perf_counter() - started,
            "weights_version": generation.weights_version}
    if retries:
        info["engine_retries"] = retries
    # the state of an agent-loop turn is its whole context: turns of one task with equal prompts are GiGPO anchors
    trajectory.turns.append(Turn(list(trajectory.ids), list(generation.token_ids), generation.logprobs, info=info,
                                 state_key=state_digest(*trajectory.ids)))
    trajectory.ids += generation.token_ids
    trajectory.messages.append({"role": "assistant", "content": text})
    if generation.finish_reason == "length":
        return terminate(trajectory, "max_tokens" if params.max_tokens == loop.params.max_tokens
                         else "max_total_tokens")
    trajectory.calls = parse_tool_calls(text) if loop.tools else []
    if trajectory.calls:
        return State.PROCESSING_TOOLS
    if trajectory.interaction is not None:
        return State.INTERACTING
    return terminate(trajectory, "answered")


async def processing_tools(loop: AgentLoop, trajectory: Trajectory) -> State:
    """Run the calls (concurrently, each under a timeout); every result, errors included, goes back
    to the model truncated to `max_tool_response_tokens` and is recorded in the turn's info."""
    results = await run_tool_calls(trajectory.calls, loop.tools, loop.max_parallel_calls, loop.tool_timeout_s)
    contents = [truncate_to_tokens(r.content, loop.tokenizer, loop.max_tool_response_tokens) for r in results]
    turn = trajectory.turns[-1]
    turn.info["tool_calls"] = [
        {"name": r.name, "arguments": c.arguments if isinstance(c, ToolCall) else None, "content": content,
         "error": r.error, "elapsed_s": r.elapsed_s}
        for c, r, content in zip(trajectory.calls, results, contents)]
    turn.valid_action = all(r.error != "malformed" for r in results)
    shown = [replace(r, content=content) for r, content in zip(results, contents)]
    inline = "".join(f"\n{format_tool_response(r)}" for r in shown) + "\n"
    append_feedback(loop, trajectory, [{"role": "tool", "content": r.content} for r in shown], inline)
    trajectory.calls = []
    return State.GENERATING


async def interacting(loop: AgentLoop, trajectory: Trajectory) -> State:
    """Ask the interaction: its reward goes to the turn just sampled, its text into the conversation."""
    feedback = await trajectory.interaction.respond(trajectory)
    turn = trajectory.turns[-1]
    turn.reward += feedback.reward
    turn.info["interaction"] = feedback.info
    if feedback.should_terminate:
        return terminate(trajectory, "interaction")
    append_feedback(loop, trajectory, [{"role": "user", "content": feedback.text}], f"\n{feedback.text}\n")
    return State.GENERATING


def append_feedback(loop: AgentLoop, trajectory: Trajectory, messages: list[dict], inline_text: str) -> None:
    """Extend the conversation with feedback: `messages` as a new round, or `inline_text` inside the
    still-open assistant message (continuation)."""
    response = trajectory.turns[-1].response_ids
    closed = bool(response) and response[-1] == loop.tokenizer.eos_token_id
    if loop.feedback == "continuation" and not closed:
        trajectory.ids += loop.tokenizer.encode(inline_text, add_special_tokens=False)
        trajectory.messages[-1]["content"] += inline_text
    else:
        trajectory.ids += new_round_ids(loop.tokenizer, messages, closed)
        trajectory.messages += messages


def terminate(trajectory: Trajectory, reason: str) -> State:
    """End the episode: the last turn terminated (an answer, or the interaction ended it) or was
    truncated (a budget ran out)."""
    trajectory.stop_reason = reason
    if trajectory.turns:
        last = trajectory.turns[-1]
        last.terminated = reason in ("answered", "interaction")
        last.truncated = not last.terminated
        last.info["stop_reason"] = reason
    return State.TERMINATED


STEPS = {State.PENDING: pending, State.GENERATING: generating, State.PROCESSING_TOOLS: processing_tools,
         State.INTERACTING: interacting}


def to_episode(trajectory: Trajectory, episode_id: str, group_id: str | None) -> Episode:
    task = trajectory.task
    tool_calls = [call for turn in trajectory.turns for call in turn.info.get("tool_calls", [])]
    metrics = {"return": sum(t.reward for t in trajectory.turns), "length": len(trajectory.turns),
               "stop_reason": trajectory.stop_reason, "tool_calls": len(tool_calls),
               "tool_errors": sum(c["error"] is not None for c in tool_calls),
               "invalid_actions": sum(not t.valid_action for t in trajectory.turns)}
    truncated = bool(trajectory.turns) and trajectory.turns[-1].truncated
    return Episode(episode_id, task.task_id, task.seed, group_id, trajectory.turns,
                   bootstrap_prompt_ids=list(trajectory.ids) if truncated else None, metrics=metrics,
                   data=dict(task.data))
