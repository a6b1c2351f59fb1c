"""The arithmetic agent with LiteLLM: `litellm.acompletion` with the `openai/` model prefix and `api_base` the
rollout's URL, a function-calling loop as LiteLLM's docs write it (the assistant message appended as
returned, then one `tool` message per call).

LiteLLM reads its model price map from the network at import unless told otherwise: it is told to use its
bundled copy and to stay offline (set before the import). The SDK sends no telemetry (1.110's telemetry
is the proxy's, off unless an operator turns it on)."""

from __future__ import annotations

import json
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")

import litellm

from integration.agent_frameworks.common import DESCRIPTION, JSON_INSTRUCTION, calculate, reward

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": DESCRIPTION,
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
ANSWER = {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": {
    "type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
    "additionalProperties": False}}}
MAX_CALLS = 4


async def agent(task: dict, base_url: str) -> float:
    return await solve(task, base_url, stream=False)


async def streamed_agent(task: dict, base_url: str) -> float:
    return await solve(task, base_url, stream=True)


async def structured_agent(task: dict, base_url: str) -> float:
    return await solve(task, base_url, stream=False, response_format=ANSWER)


async def solve(task: dict, base_url: str, stream: bool, response_format: dict | None = None) -> float:
    """The reward of a function-calling loop; `stream`: each response streamed, rebuilt with
    `litellm.stream_chunk_builder`; `response_format` sent with every call (the answer is then its JSON)."""
    messages = list(task["messages"])
    if response_format is not None:
        messages[0] = {**messages[0], "content": messages[0]["content"] + JSON_INSTRUCTION}
    answer = ""
    for _ in range(MAX_CALLS):
        response = await litellm.acompletion(model="openai/policy", api_base=base_url, api_key="unused",
                                             messages=messages, tools=[CALCULATOR], stream=stream,
                                             response_format=response_format)
        if stream:
            response = litellm.stream_chunk_builder([chunk async for chunk in response], messages=messages)
        message = response.choices[0].message
        messages.append(message)
        if not message.tool_calls:
            answer = message.content or ""
            if response_format is not None:
                answer = str(json.loads(answer)["answer"]) if answer.startswith("{") else ""
            break
        for call in message.tool_calls:
            expression = json.loads(call.function.arguments).get("expression", "")
            messages.append({"role": "tool", "tool_call_id": call.id, "name": call.function.name,
                             "content": calculate(str(expression))})
    return reward(answer, task)
