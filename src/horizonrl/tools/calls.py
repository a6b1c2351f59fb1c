"""Tool calls in the Qwen/Hermes format: parsing them out of a response, running them, showing results.

The model writes one block per call, anywhere in its response, possibly several:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "2+3"}}
    </tool_call>

Whitespace around the JSON is optional, "arguments" may be omitted (no arguments) or be a
JSON-encoded string. Each result goes back to the model as
`<tool_response>\\n{content}\\n</tool_response>`.

A call that cannot run becomes a `ToolResult` whose `error` is one of "malformed" (the block is
not a valid call), "unknown_tool", "bad_arguments" (the arguments do not fit the signature),
"exception" (the tool raised) or "timeout"; its `content` is then the `Error: ...` message the
model sees, so no call is ever dropped silently.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from dataclasses import dataclass

from horizonrl.tools.registry import Tool

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclass(frozen=True)
class ToolResult:
    name: str
    content: str               # the tool's output, or the `Error: ...` message when error is set
    error: str | None = None   # None, "malformed", "unknown_tool", "bad_arguments", "exception" or "timeout"
    elapsed_s: float = 0.0


def failure(name: str, error: str, message: str, elapsed_s: float = 0.0) -> ToolResult:
    """A failed call's result: the model sees `Error: <message>`."""
    return ToolResult(name, f"Error: {message}", error, elapsed_s)


def parse_block(block: str) -> ToolCall | ToolResult:
    """The call in the text following one `<tool_call>` tag, or a "malformed" result saying what is wrong."""
    body, closed, _ = block.partition(CLOSE_TAG)
    if not closed:
        return failure("", "malformed", f"tool call is not closed with {CLOSE_TAG}")
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as err:
        return failure("", "malformed", f"tool call is not valid JSON: {err}")
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return failure("", "malformed", 'tool call must be a JSON object with a "name" string')
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as err:
            return failure(payload["name"], "malformed", f"tool call arguments string is not valid JSON: {err}")
    if not isinstance(arguments, dict):
        return failure(payload["name"], "malformed", 'tool call "arguments" must be a JSON object')
    return ToolCall(payload["name"], arguments)


def parse_tool_calls(text: str) -> list[ToolCall | ToolResult]:
    """One entry per `<tool_call>` block of text, in order: the call, or a "malformed" result."""
    return [parse_block(block) for block in text.split(OPEN_TAG)[1:]]


async def invoke(tool: Tool, arguments: dict):
    """The tool's output: awaited for an async fn, run in a worker thread for a sync one so that it
    does not block the event loop."""
    if inspect.iscoroutinefunction(tool.fn):
        return await tool.fn(**arguments)
    return await asyncio.to_thread(tool.fn, **arguments)


async def run_tool_call(call: ToolCall, tools: dict[str, Tool], timeout_s: float) -> ToolResult:
    """Runs one call with a time limit; every failure comes back as a ToolResult, never raised.

    A sync tool past its time limit is reported as timed out but its thread runs on (threads
    cannot be killed); tools that may hang should bound themselves, as the sandbox does.
    """
    tool = tools.get(call.name)
    if tool is None:
        return failure(call.name, "unknown_tool",
                       f"unknown tool {call.name!r}; available tools: {', '.join(sorted(tools))}")
    try:
        inspect.signature(tool.fn).bind(**call.arguments)
    except TypeError as err:
        return failure(call.name, "bad_arguments", f"bad arguments for {call.name}: {err}")
    start = time.perf_counter()
    task = asyncio.ensure_future(invoke(tool, call.arguments))
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    finally:
        task.cancel()
    elapsed_s = time.perf_counter() - start
    if not done:
        return failure(call.name, "timeout", f"{call.name} timed out after {timeout_s} s", elapsed_s)
    try:
        output = task.result()
    except Exception as err:
        return failure(call.name, "exception", f"{type(err).__name__}: {err}", elapsed_s)
    return ToolResult(call.name, str(output), None, elapsed_s)


async def run_tool_calls(calls: list[ToolCall | ToolResult], tools: dict[str, Tool],
                         max_parallel_calls: int, timeout_s: float) -> list[ToolResult]:
    """The results of `calls` in call order, at most `max_parallel_calls` running at once; results
    already in the list (the parser's "malformed" ones) pass through unchanged."""
    slots = asyncio.Semaphore(max_parallel_calls)

    async def run(call: ToolCall | ToolResult) -> ToolResult:
        if isinstance(call, ToolResult):
            return call
        async with slots:
            return await run_tool_call(call, tools, timeout_s)

    return list(await asyncio.gather(*(run(call) for call in calls)))


def truncate_to_tokens(text: str, tokenizer, max_tokens: int) -> str:
    """text cut to its first `max_tokens` tokens, followed by `\\n...[truncated N tokens]` counting the
    tokens cut; unchanged when it fits. (The cut may split a multi-byte character.)"""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= max_tokens:
        return text
    return f"{tokenizer.decode(ids[:max_tokens])}\n...[truncated {len(ids) - max_tokens} tokens]"


def format_tool_response(result: ToolResult) -> str:
    """The text the model sees for one result, Qwen2.5 style."""
    return f"<tool_response>\n{result.content}\n</tool_response>"
