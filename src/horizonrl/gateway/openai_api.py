"""The OpenAI chat and completions APIs as pure functions: request bodies in, (prompt ids, sampling
parameters) to the engine, its Generations out as the response and choice dicts the client reads.

Prompts are built exactly as training builds them: chat messages (normalised, see `normalise_messages`)
and tool schemas through the tokenizer's chat template (`chat_prompt_ids`); a completions prompt is a
string (encoded without special tokens) or a list of token ids used as is. Responses carry the exact ids
(`prompt_token_ids` at the top, `token_ids` on each choice, as vLLM's return_token_ids does). vLLM's sampling
extensions `stop_token_ids` and `ignore_eos` are honoured, so that a client written for vLLM's token-exact API
(engines/openai_server.py) samples here as there.

Options we cannot honour exactly are refused with a 400 naming them, never ignored: top log-probs, echo,
suffix, best_of, penalties, logit_bias and any field this module does not know. reasoning_effort,
verbosity, store, metadata and user are accepted and change nothing (they ask for things this server has
no use for: a reasoning budget, stored completions, tags); README lists them.

`tool_choice` "required" or a named function, and `response_format` json_object / json_schema, are honoured
by constraining the response (`constraint`): the engine samples only tokens that keep it within a grammar.
`parallel_tool_calls: false` ends the response at the first call's closing tag.

Stop strings: the engine ends a response at the first token after which its text contains one (as a
regular expression, `re.escape`d); the returned text is cut before the earliest match, as OpenAI does,
while the token ids and log-probs keep every sampled token (the last ones spell the stop string).
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, replace
from typing import Any, Literal

import jinja2
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from horizonrl.agents.agent import chat_prompt_ids
from horizonrl.engines.base import Generation, SamplingParams
from horizonrl.engines.grammar import call_or_json_grammar, json_grammar, tool_call_grammar
from horizonrl.tools.calls import CLOSE_TAG, OPEN_TAG, ToolCall, parse_tool_calls


class RequestError(Exception):
    """A request the gateway refuses: answered with `status` and an OpenAI error body."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


@dataclass(frozen=True)
class ServedModel:
    """What the gateway serves and its limits: `context_len` tokens of prompt + response, `max_tokens`
    response tokens (a request for more is refused, or with `cap_max_tokens` given `max_tokens`) and `max_n`
    choices per request at most; `stop_ids` end every response (EOS). `constraint_refusal`: why a request that
    needs constrained decoding is refused here (None: it is served)."""

    tokenizer: Any
    name: str
    context_len: int
    stop_ids: tuple[int, ...]
    max_tokens: int = 1024
    max_n: int = 8
    cap_max_tokens: bool = False
    constraint_refusal: str | None = None


class Body(BaseModel):
    """A JSON object of the API: unknown fields are ignored, null means the field's default."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data):
        return {key: value for key, value in data.items() if value is not None} if isinstance(data, dict) else data


class _TextPart(Body):
    type: Literal["text"]
    text: str


class _Function(Body):
    name: str
    arguments: str | dict = "{}"


class _ToolCall(Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: _Function


class _Message(Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[_TextPart] | None = None
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class _FunctionSchema(Body):
    name: str


class _ToolSchema(Body):
    type: Literal["function"]
    function: _FunctionSchema


class _StreamOptions(Body):
    include_usage: bool = False


class _NamedFunction(Body):
    name: str


class _NamedToolChoice(Body):
    type: Literal["function"]
    function: _NamedFunction


class _JsonSchemaFormat(Body):
    name: str | None = None
    json_schema: dict | None = Field(None, alias="schema")   # None: any JSON object
    strict: bool | None = None


class _ResponseFormat(Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: _JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError('type "json_schema" needs a "json_schema" object')
        return self


class _Request(Body):
    """Fields both APIs share. A field not declared here or in a subclass is refused (`parse_request`)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    n: int = Field(1, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)   # 64-bit, as vLLM's (RequestSeeds' are 63-bit)
    stream: bool = False
    stream_options: _StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    reasoning_effort: Any = None     # these five: no effect
    verbosity: Any = None
    store: Any = None
    metadata: Any = None
    user: Any = None
    return_token_ids: bool = True    # vLLM's extensions, these three: the ids are always returned
    stop_token_ids: list[int] | None = None      # more ids that end a response
    ignore_eos: bool = False         # the model's own stop ids do not end it: only stop_token_ids do

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, stop):
        if stop is not None and "" in ([stop] if isinstance(stop, str) else stop):
            raise ValueError("stop strings must not be empty")
        return stop


class ChatRequest(_Request):
    messages: list[_Message] = Field(min_length=1)
    tools: list[dict] | None = None  # kept as sent: the template renders them key for key
    tool_choice: Literal["auto", "none", "required"] | _NamedToolChoice = "auto"
    parallel_tool_calls: bool = True
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=1)
    response_format: _ResponseFormat | None = None

    @field_validator("tools")
    @classmethod
    def _function_tools(cls, tools):
        for tool in tools or []:
            _ToolSchema.model_validate(tool)
        return tools


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt):
        if not isinstance(prompt, str) and prompt and not isinstance(prompt[0], int):
            raise ValueError("one prompt per request: a string or a list of token ids")
        return prompt


def parse_request(raw: bytes, kind: Literal["chat", "completions"]) -> ChatRequest | CompletionRequest:
    """The validated request body, or a RequestError naming the malformed JSON, wrong field or option
    we do not support."""
    request = validated(ChatRequest if kind == "chat" else CompletionRequest, json_object(raw))
    refuse_unsupported(request)
    if isinstance(request, ChatRequest):
        check_tool_choice(request)
    return request


def json_object(raw: bytes) -> dict:
    """The request body's JSON object, or a RequestError saying it is none."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RequestError(f"the request body is not valid JSON: {error}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise RequestError("the request body must be a JSON object")
    return data


def validated(model: type[BaseModel], data: dict, prefix: str = ""):
    """`model` validated from `data`, or a RequestError naming the first wrong field (`prefix` + its path);
    a field `model` does not declare is named as not supported."""
    try:
        return model.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        param = prefix + ".".join(str(part) for part in first["loc"])
        if first["type"] == "extra_forbidden":
            raise RequestError(f"{param} is not supported by this server", param=param, code="unsupported") from None
        raise RequestError(f"{param}: {first['msg']}", param=param) from None


def refuse_unsupported(request: ChatRequest | CompletionRequest) -> None:
    """RequestError naming the first option set that the gateway cannot honour exactly."""
    unsupported = {
        "presence_penalty": request.presence_penalty not in (None, 0),
        "frequency_penalty": request.frequency_penalty not in (None, 0),
        "logit_bias": bool(request.logit_bias),
    }
    if isinstance(request, ChatRequest):
        unsupported["top_logprobs"] = bool(request.top_logprobs)
    else:
        unsupported |= {
            "logprobs": bool(request.logprobs),   # completions' logprobs=N asks for the top N
            "echo": request.echo,
            "suffix": request.suffix is not None,
            "best_of": request.best_of not in (None, request.n),
        }
    param = next((name for name, is_set in unsupported.items() if is_set), None)
    if param is not None:
        raise RequestError(f"{param}={getattr(request, param)!r} is not supported by this server", param=param,
                           code="unsupported")


def check_tool_choice(request: ChatRequest) -> None:
    """RequestError unless a tool_choice that forces a call has tools to call (the named one among them)."""
    names = [tool["function"]["name"] for tool in request.tools or []]
    if request.tool_choice in ("auto", "none"):
        return
    if not names:
        raise RequestError(f"tool_choice={request.tool_choice!r} needs tools", param="tool_choice")
    if isinstance(request.tool_choice, _NamedToolChoice) and request.tool_choice.function.name not in names:
        raise RequestError(f"tool_choice names the function {request.tool_choice.function.name!r}, which is not "
                           f"among the tools {names}", param="tool_choice")


def constraint(request: ChatRequest | CompletionRequest) -> str | None:
    """The grammar the response must match, or None (unconstrained): one call of the named function or (tool_choice
    "required") of any tool; else, with a JSON response format, a JSON object (json_object) or a value of the
    schema (json_schema) — or, when tools may also be called ("auto"), either a call or that JSON."""
    if not isinstance(request, ChatRequest):
        return None
    json_format = request.response_format
    wants_json = json_format is not None and json_format.type != "text"
    if isinstance(request.tool_choice, _NamedToolChoice):
        return tool_call_grammar(request.tools, request.tool_choice.function.name)
    if request.tool_choice == "required":
        return tool_call_grammar(request.tools)
    if not wants_json:
        return None
    schema = json_format.json_schema.json_schema if json_format.type == "json_schema" else None
    return call_or_json_grammar(request.tools, schema) if uses_tools(request) else json_grammar(schema)


def normalise_messages(messages: list[_Message]) -> list[dict]:
    """Messages as the chat template expects them: content a string (text parts joined by newlines, None
    -> ""), "developer" as "system", and each assistant tool call's `function.arguments` a dict (parsed
    from its JSON string), so that the template renders the JSON the model wrote."""
    normalised = []
    for i, message in enumerate(messages):
        content = message.content
        if isinstance(content, list):
            content = "\n".join(part.text for part in content)
        entry = {"role": "system" if message.role == "developer" else message.role, "content": content or ""}
        if message.tool_calls:
            entry["tool_calls"] = [
                {"id": call.id, "type": "function",
                 "function": {"name": call.function.name, "arguments": _arguments(call.function.arguments,
                                                                                  f"messages.{i}.tool_calls.{j}")}}
                for j, call in enumerate(message.tool_calls)]
        for key in ("tool_call_id", "name"):
            if getattr(message, key) is not None:
                entry[key] = getattr(message, key)
        normalised.append(entry)
    return normalised


def _arguments(arguments: str | dict, param: str) -> dict:
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise RequestError(f"{param}.function.arguments must be a JSON object", param=param)
    return parsed


def uses_tools(request: ChatRequest | CompletionRequest) -> bool:
    """Whether tool-call blocks in the response are parsed: the request offers tools and allows calls."""
    return isinstance(request, ChatRequest) and bool(request.tools) and request.tool_choice != "none"


def prompt_of(request: ChatRequest | CompletionRequest, model: ServedModel) -> tuple[list[int], list[dict] | None]:
    """The prompt's token ids and (chat) the normalised messages they render: chat messages and tools
    through the chat template, or the completions prompt encoded (a string) or as given (token ids, each
    in the vocabulary)."""
    if isinstance(request, ChatRequest):
        messages = normalise_messages(request.messages)
        try:
            return chat_prompt_ids(model.tokenizer, messages, request.tools), messages
        except (jinja2.TemplateError, TypeError, KeyError, ValueError) as error:
            raise RequestError(f"the messages do not render with the model's chat template: {error}",
                               param="messages") from None
    if isinstance(request.prompt, str):
        ids = model.tokenizer.encode(request.prompt, add_special_tokens=False)
    else:
        ids = list(request.prompt)
        if any(not 0 <= i < len(model.tokenizer) for i in ids):
            raise RequestError(f"prompt: token ids must be in [0, {len(model.tokenizer)})", param="prompt")
    if not ids:
        raise RequestError("prompt is empty", param="prompt")
    return ids, None


def asked_max_tokens(request: ChatRequest | CompletionRequest) -> int | None:
    return getattr(request, "max_completion_tokens", None) or request.max_tokens


def choice_params(request: ChatRequest | CompletionRequest, prompt_len: int,
                  model: ServedModel) -> list[SamplingParams]:
    """The sampling parameters of each of the request's n choices (choice i seeded seed + i), or a
    RequestError when the prompt, max_tokens or n exceed the model's limits."""
    room = model.context_len - prompt_len
    if room < 1:
        raise RequestError(f"the prompt has {prompt_len} tokens; this model's context is {model.context_len}",
                           param="messages" if isinstance(request, ChatRequest) else "prompt",
                           code="context_length_exceeded")
    if request.n > model.max_n:
        raise RequestError(f"n={request.n} is over this server's limit of {model.max_n}", param="n")
    asked = asked_max_tokens(request)
    if asked is not None and asked > model.max_tokens:
        if not model.cap_max_tokens:
            raise RequestError(f"max_tokens={asked} is over this server's limit of {model.max_tokens}",
                               param="max_tokens")
        asked = model.max_tokens
    if asked is not None and asked > room:
        raise RequestError(f"the prompt ({prompt_len} tokens) + max_tokens ({asked}) exceed this model's context of "
                           f"{model.context_len}", param="max_tokens", code="context_length_exceeded")
    grammar = constraint(request)
    if grammar is not None and model.constraint_refusal is not None:
        param = "response_format" if request.tool_choice in ("auto", "none") else "tool_choice"
        raise RequestError(f"{param}: {model.constraint_refusal}", param=param, code="unsupported")
    stops = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    if uses_tools(request) and not request.parallel_tool_calls:
        stops.append(CLOSE_TAG)                        # one call at most: the response ends where it closes
    params = SamplingParams(max_tokens=asked or min(room, model.max_tokens),
                            temperature=1.0 if request.temperature is None else request.temperature,
                            top_p=1.0 if request.top_p is None else request.top_p, stop_ids=stop_ids_of(request, model),
                            stop_patterns=tuple(re.escape(stop) for stop in stops), grammar=grammar)
    return [replace(params, seed=None if request.seed is None else int64(request.seed + i)) for i in range(request.n)]


def int64(value: int) -> int:
    """`value` wrapped into a signed 64-bit integer (choice i of a request is seeded seed + i)."""
    return (value + 2**63) % 2**64 - 2**63


def stop_ids_of(request: ChatRequest | CompletionRequest, model: ServedModel) -> tuple[int, ...]:
    """The ids that end a response: the request's `stop_token_ids`, and the model's own unless `ignore_eos`."""
    return tuple(request.stop_token_ids or ()) + (() if request.ignore_eos else model.stop_ids)


def cut_at_stop(text: str, stops: str | list[str] | None) -> str:
    """`text` up to (not including) the earliest occurrence of any stop string."""
    stops = [stops] if isinstance(stops, str) else stops or []
    starts = [start for start in (text.find(stop) for stop in stops) if start >= 0]
    return text[:min(starts)] if starts else text


def openai_tool_call(call: ToolCall) -> dict:
    return {"id": f"call_{secrets.token_hex(12)}", "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}


def assistant_message(text: str, parse_tools: bool) -> tuple[dict, bool]:
    """The assistant message for response `text`, and whether its tool-call blocks failed to parse.
    With `parse_tools` and `<tool_call>` blocks that all parse: the calls, and as content the text before
    the first block (stripped; None if empty); any malformed block: the whole text as content."""
    if not parse_tools or OPEN_TAG not in text:
        return {"role": "assistant", "content": text}, False
    calls = parse_tool_calls(text)
    if not all(isinstance(call, ToolCall) for call in calls):
        return {"role": "assistant", "content": text}, True
    content = text.split(OPEN_TAG, 1)[0].strip() or None
    return {"role": "assistant", "content": content, "tool_calls": [openai_tool_call(call) for call in calls]}, False


@dataclass(frozen=True)
class Answer:
    """One choice as the client sees it: the chat message or {"text": ...}, its finish reason, and
    whether its tool-call blocks failed to parse."""

    response: dict
    finish_reason: str
    tool_call_parse_failed: bool = False


def answer(request: ChatRequest | CompletionRequest, generation: Generation, tokenizer) -> Answer:
    """The choice's answer: the response decoded (special tokens skipped), cut before a stop string,
    and (chat with tools) its tool calls parsed."""
    text = cut_at_stop(tokenizer.decode(generation.token_ids, skip_special_tokens=True), request.stop)
    if isinstance(request, CompletionRequest):
        return Answer({"text": text}, generation.finish_reason)
    message, failed = assistant_message(text, uses_tools(request))
    return Answer(message, "tool_calls" if "tool_calls" in message else generation.finish_reason, failed)


def token_texts(tokenizer, token_ids: list[int]) -> list[str]:
    return [tokenizer.decode([token_id]) for token_id in token_ids]


def logprobs_of(request: ChatRequest | CompletionRequest, generation: Generation, tokenizer) -> dict | None:
    """The choice's `logprobs`: one entry per sampled token (stop and EOS tokens included); None unless
    asked for and the engine has log-probs. Chat: `{"content": [{"token", "logprob", "bytes",
    "top_logprobs": []}]}`; completions: `{"tokens", "token_logprobs", "top_logprobs": None,
    "text_offset"}`, the offsets counted in the concatenated token texts."""
    wanted = request.logprobs if isinstance(request, ChatRequest) else request.logprobs is not None
    if not wanted or generation.logprobs is None:
        return None
    texts = token_texts(tokenizer, generation.token_ids)
    if isinstance(request, ChatRequest):
        return {"content": [{"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []}
                            for text, logprob in zip(texts, generation.logprobs)]}
    offsets = [sum(len(text) for text in texts[:k]) for k in range(len(texts))]
    return {"tokens": texts, "token_logprobs": list(generation.logprobs), "top_logprobs": None,
            "text_offset": offsets}


def response_header(request: ChatRequest | CompletionRequest, model: ServedModel, created: int,
                    stream: bool = False) -> dict:
    """The fields every response (or chunk) of one request shares."""
    chat = isinstance(request, ChatRequest)
    kind = ("chat.completion.chunk" if stream else "chat.completion") if chat else "text_completion"
    return {"id": f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(12)}", "object": kind, "created": created,
            "model": model.name}


def choice_dict(request: ChatRequest | CompletionRequest, index: int, reply: Answer, generation: Generation,
                tokenizer) -> dict:
    """One choice of a (non-streamed) response."""
    key = "message" if isinstance(request, ChatRequest) else "text"
    value = reply.response if isinstance(request, ChatRequest) else reply.response["text"]
    return {"index": index, key: value, "logprobs": logprobs_of(request, generation, tokenizer),
            "finish_reason": reply.finish_reason, "token_ids": generation.token_ids}


def usage(prompt_len: int, generations: list[Generation]) -> dict:
    completion = sum(len(generation.token_ids) for generation in generations)
    return {"prompt_tokens": prompt_len, "completion_tokens": completion, "total_tokens": prompt_len + completion}


def choice_chunks(request: ChatRequest | CompletionRequest, index: int, reply: Answer, generation: Generation,
                  tokenizer) -> list[dict]:
    """The streamed chunks' `choices` entries for one whole choice. Chat: the role, then the content
    and/or the tool calls (each with its `index`), then the finish reason with the `token_ids`;
    completions: the text, then the finish reason with the `token_ids`."""
    logprobs = logprobs_of(request, generation, tokenizer)
    if isinstance(request, CompletionRequest):
        return [{"index": index, "text": reply.response["text"], "logprobs": logprobs, "finish_reason": None},
                {"index": index, "text": "", "logprobs": None, "finish_reason": reply.finish_reason,
                 "token_ids": generation.token_ids}]
    delta = {"content": reply.response["content"]} if reply.response["content"] else {}
    if "tool_calls" in reply.response:
        delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(reply.response["tool_calls"])]
    return [{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None},
            {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None},
            {"index": index, "delta": {}, "logprobs": None, "finish_reason": reply.finish_reason,
             "token_ids": generation.token_ids}]
