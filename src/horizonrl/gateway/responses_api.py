"""The OpenAI Responses API (`POST /v1/responses`) as pure functions over the chat API (openai_api).

A request is served as the one-choice ChatRequest it amounts to (`chat_request`), so its prompt, sampling
and recorded Call are exactly a chat call's:

    instructions                       -> a system message, first
    input: a string                    -> one user message
    input items: message (any role, content a string or input_text/output_text parts) -> that message
                 function_call         -> a tool call of an assistant message (a run of calls, with the
                                          assistant message just before them, is one message: one response)
                 function_call_output  -> the tool message answering its call_id
    previous_response_id               -> that response's conversation (its input and output; not its
                                          instructions, as OpenAI does) before the input (`ResponseStore`:
                                          kept until the response's rollout is collected)
    tools [{type: function, name, description, parameters}] -> chat tools {type, function: {...}}
    tool_choice, parallel_tool_calls, max_output_tokens, temperature, top_p, text.format -> their chat twins
    include ["message.output_text.logprobs"] -> logprobs

The choice's assistant message becomes the output items (`output_items`): a message with its text (when it
has text or calls nothing), then a function_call per tool call. A response cut by max_output_tokens is
"incomplete". Streamed, the whole response goes out as the event sequence clients read (`response_events`),
once it is sampled. `prompt_token_ids` and `token_ids` carry the exact ids, as on chat responses.
Accepted with no effect: metadata, user, reasoning (this server adds no reasoning
items), truncation "disabled" (the only mode: a prompt over the context is refused), a tool's `strict` (only
a forced call is constrained to the tool's parameters). Any other field is refused with a 400 naming it.
"""

from __future__ import annotations

import secrets
from collections import deque
from typing import Any, Literal

from pydantic import ConfigDict, Field

from horizonrl.gateway.openai_api import Body, ChatRequest, RequestError, check_tool_choice, json_object, validated

LOGPROBS_INCLUDE = "message.output_text.logprobs"


class _FunctionTool(Body):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None        # no effect


class _NamedFunctionChoice(Body):
    type: Literal["function"]
    name: str


class _TextFormat(Body):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    json_schema: dict | None = Field(None, alias="schema")
    strict: bool | None = None


class _TextOptions(Body):
    format: _TextFormat | None = None
    verbosity: Any = None             # no effect, as on chat


class ResponsesRequest(Body):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    input: str | list[dict]
    instructions: str | None = None
    tools: list[_FunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | _NamedFunctionChoice = "auto"
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    previous_response_id: str | None = None
    text: _TextOptions | None = None
    store: bool = True
    include: list[str] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=0)
    truncation: Literal["disabled"] | None = None
    metadata: Any = None              # no effect
    user: Any = None
    reasoning: Any = None


class _Part(Body):
    type: Literal["input_text", "output_text", "text"]
    text: str


class _MessageItem(Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[_Part]


class _FunctionCallItem(Body):
    call_id: str
    name: str
    arguments: str


class _FunctionCallOutputItem(Body):
    call_id: str
    output: str | list[_Part]


def parse_responses_request(raw: bytes) -> ResponsesRequest:
    """The validated request, or a RequestError naming the malformed JSON or the wrong or unsupported field."""
    return validated(ResponsesRequest, json_object(raw))


def _text(content: str | list[_Part]) -> str:
    return content if isinstance(content, str) else "\n".join(part.text for part in content)


def input_messages(request: ResponsesRequest) -> list[dict]:
    """The request's input as chat messages (see the module docstring), or a RequestError naming an item
    of a type this server does not serve."""
    if isinstance(request.input, str):
        return [{"role": "user", "content": request.input}]
    messages: list[dict] = []
    for i, item in enumerate(request.input):
        kind, where = item.get("type", "message"), f"input.{i}."
        if kind == "message":
            message = validated(_MessageItem, item, where)
            messages.append({"role": message.role, "content": _text(message.content)})
        elif kind == "function_call":
            call = validated(_FunctionCallItem, item, where)
            if not messages or messages[-1]["role"] != "assistant":
                messages.append({"role": "assistant", "content": None})
            messages[-1].setdefault("tool_calls", []).append(
                {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}})
        elif kind == "function_call_output":
            result = validated(_FunctionCallOutputItem, item, where)
            messages.append({"role": "tool", "tool_call_id": result.call_id, "content": _text(result.output)})
        else:
            raise RequestError(f"{where}type: input items of type {kind!r} are not supported by this server "
                               "(message, function_call, function_call_output are)", param=f"{where}type",
                               code="unsupported")
    return messages


def chat_request(request: ResponsesRequest, conversation: list[dict]) -> ChatRequest:
    """The one-choice chat request `request` amounts to, `conversation` (the earlier messages and this
    request's input, as chat messages) after its instructions."""
    if not conversation:
        raise RequestError("input: no input (and no previous_response_id to continue)", param="input")
    system = [{"role": "system", "content": request.instructions}] if request.instructions is not None else []
    tools = [{"type": "function", "function": tool.model_dump(exclude={"type", "strict"}, exclude_none=True)}
             for tool in request.tools or []]
    tool_choice = request.tool_choice
    if isinstance(tool_choice, _NamedFunctionChoice):
        tool_choice = {"type": "function", "function": {"name": tool_choice.name}}
    text_format = request.text.format if request.text is not None else None
    response_format = None
    if text_format is not None:
        response_format = {"type": text_format.type}
        if text_format.type == "json_schema":
            response_format["json_schema"] = {"name": text_format.name, "schema": text_format.json_schema,
                                              "strict": text_format.strict}
    chat = validated(ChatRequest, {
        "messages": system + conversation, "tools": tools or None, "tool_choice": tool_choice,
        "parallel_tool_calls": request.parallel_tool_calls, "max_tokens": request.max_output_tokens,
        "temperature": request.temperature, "top_p": request.top_p, "response_format": response_format,
        "logprobs": LOGPROBS_INCLUDE in (request.include or [])})
    check_tool_choice(chat)
    return chat


class ResponseStore:
    """The conversations of stored responses (input and output as chat messages), by response id: what a later
    request's `previous_response_id` continues, on any route.

    A rollout's responses are kept until `forget(rollout_id)`, its collection (`Gateway.calls_over`), however many
    other rollouts store theirs meanwhile: a slow rollout's conversation is never evicted under it. Responses of no
    rollout (the plain /v1 routes of a serving gateway, which nothing collects), the last `capacity` of them."""

    def __init__(self, capacity: int = 4096):
        self.capacity = capacity
        self._conversations: dict[str, list[dict]] = {}
        self._ids: dict[str | None, deque[str]] = {}   # each rollout's response ids (None: no rollout's), in order

    def keep(self, rollout_id: str | None, response_id: str, conversation: list[dict]) -> None:
        self._conversations[response_id] = conversation
        ids = self._ids.setdefault(rollout_id, deque())
        ids.append(response_id)
        if rollout_id is None and len(ids) > self.capacity:
            del self._conversations[ids.popleft()]

    def forget(self, rollout_id: str) -> None:
        """The rollout was collected: its responses are no longer kept."""
        for response_id in self._ids.pop(rollout_id, ()):
            del self._conversations[response_id]

    def conversation(self, response_id: str | None) -> list[dict]:
        """The stored conversation of `response_id` ([] for None), or a RequestError if none is stored."""
        if response_id is None:
            return []
        if response_id not in self._conversations:
            raise RequestError(f"previous_response_id: no stored response {response_id!r}: this gateway keeps a "
                               "rollout's responses until the rollout is collected, of those made on the plain /v1 "
                               f"routes the last {self.capacity}, and none sent with store: false",
                               param="previous_response_id", code="previous_response_not_found")
        return list(self._conversations[response_id])


def output_items(message: dict, logprobs: dict | None) -> list[dict]:
    """The Responses output items of a chat assistant `message` (and its chat `logprobs`, if asked for)."""
    items = []
    if message.get("content") or not message.get("tool_calls"):
        items.append({"type": "message", "id": f"msg_{secrets.token_hex(12)}", "status": "completed",
                      "role": "assistant", "content": [{"type": "output_text", "text": message.get("content") or "",
                                                        "annotations": [],
                                                        "logprobs": logprobs["content"] if logprobs else []}]})
    items += [{"type": "function_call", "id": f"fc_{secrets.token_hex(12)}", "call_id": call["id"],
               "name": call["function"]["name"], "arguments": call["function"]["arguments"], "status": "completed"}
              for call in message.get("tool_calls", [])]
    return items


def response_object(request: ResponsesRequest, model_name: str, created: int, items: list[dict],
                    finish_reason: str, prompt_ids: list[int], token_ids: list[int]) -> dict:
    """The Response: its output items, status ("incomplete" when cut by max_output_tokens), usage, the
    request's settings echoed, and the exact token ids."""
    incomplete = finish_reason == "length"
    return {
        "id": f"resp_{secrets.token_hex(12)}", "object": "response", "created_at": created,
        "status": "incomplete" if incomplete else "completed", "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": request.instructions, "max_output_tokens": request.max_output_tokens, "model": model_name,
        "output": items, "parallel_tool_calls": request.parallel_tool_calls,
        "previous_response_id": request.previous_response_id, "reasoning": request.reasoning,
        "store": request.store, "temperature": request.temperature, "top_p": request.top_p,
        "text": request.text.model_dump(by_alias=True, exclude_none=True) if request.text else {
            "format": {"type": "text"}},
        "tool_choice": request.tool_choice if isinstance(request.tool_choice, str) else
        request.tool_choice.model_dump(),
        "tools": [tool.model_dump(exclude_none=True) for tool in request.tools or []],
        "truncation": "disabled", "metadata": request.metadata or {}, "user": request.user,
        "usage": {"input_tokens": len(prompt_ids), "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": len(token_ids), "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": len(prompt_ids) + len(token_ids)},
        "prompt_token_ids": prompt_ids, "token_ids": token_ids}


def response_events(response: dict) -> list[dict]:
    """The streamed events of a whole `response`, in order, each with its `type` and `sequence_number`:
    created, in_progress, each output item's added / content or argument deltas / done, then completed
    (or incomplete)."""
    pending = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    events = [{"type": "response.created", "response": pending}, {"type": "response.in_progress", "response": pending}]
    for index, item in enumerate(response["output"]):
        at = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            part = item["content"][0]
            events += [
                {"type": "response.output_item.added", "output_index": index,
                 "item": {**item, "status": "in_progress", "content": []}},
                {"type": "response.content_part.added", **at, "content_index": 0, "part": {**part, "text": ""}},
                {"type": "response.output_text.delta", **at, "content_index": 0, "delta": part["text"],
                 "logprobs": part["logprobs"]},
                {"type": "response.output_text.done", **at, "content_index": 0, "text": part["text"],
                 "logprobs": part["logprobs"]},
                {"type": "response.content_part.done", **at, "content_index": 0, "part": part}]
        else:
            events += [
                {"type": "response.output_item.added", "output_index": index,
                 "item": {**item, "status": "in_progress", "arguments": ""}},
                {"type": "response.function_call_arguments.delta", **at, "delta": item["arguments"]},
                {"type": "response.function_call_arguments.done", **at, "name": item["name"],
                 "arguments": item["arguments"]}]
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": f"response.{response['status']}", "response": response})
    return [{**event, "sequence_number": k} for k, event in enumerate(events)]
