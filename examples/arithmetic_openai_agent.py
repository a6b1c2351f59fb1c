"""An agent written against the OpenAI API alone (no horizonrl import), trained unmodified by horizonrl.

    horizonrl train configs/arithmetic_openai_agent.yaml

It solves an arithmetic word problem with function calling: the model calls the `calculator` tool, the
agent runs the tool and sends the result back, and the model states the answer. It returns its reward:
1.0 when the final message says "The answer is N" with the right N, else 0.0. horizonrl calls
`agent(task, base_url)` once per rollout, `base_url` being the rollout's own URL on its gateway, which
records every call's exact tokens; any agent with this signature trains the same way.
"""

from __future__ import annotations

import ast
import json
import operator
import re
import ssl

from openai import AsyncOpenAI, DefaultAsyncHttpxClient

CALCULATOR = {"type": "function", "function": {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression with integers, + - * and parentheses.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
MAX_CALLS = 4
TLS = ssl.create_default_context()
"""Built once and given to every rollout's client: the openai package builds a TLS context for each new client,
even for an http:// URL, which loads the CA bundle (~20 ms of CPU, more than the rest of a rollout's own work)."""


def calculate(expression: str) -> str:
    """The value of an integer expression of + - * and parentheses, or an error message for the model."""
    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"cannot evaluate {ast.unparse(node)!r}")
    try:
        return str(value(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError) as error:
        return f"Error: {error}"


async def run_calculator(expression: str) -> str:
    """The calculator tool as the agent runs it (benchmarks/async.py swaps in a slow one)."""
    return calculate(expression)


async def agent(task: dict, base_url: str, calculator=run_calculator) -> float:
    """Call the model until it answers without a tool call (at most MAX_CALLS calls); the reward of the answer.
    `calculator`: an async function from an expression to the tool's answer."""
    messages = list(task["messages"])
    answer = ""
    async with AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0,
                           http_client=DefaultAsyncHttpxClient(verify=TLS)) as client:
        for _ in range(MAX_CALLS):
            response = await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                answer = message.content or ""
                break
            for call in message.tool_calls:
                try:
                    expression = json.loads(call.function.arguments).get("expression", "")
                except (json.JSONDecodeError, AttributeError):
                    expression = ""
                messages.append({"role": "tool", "tool_call_id": call.id, "content": await calculator(str(expression))})
    stated = re.search(r"The answer is (-?\d+)", answer)
    return float(stated is not None and int(stated.group(1)) == task["data"]["answer"])
