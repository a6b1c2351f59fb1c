"""Agents that fail or re-render their history, for training runs of configs/arithmetic_openai_agent.yaml
(`task.agent=tests/integration/misbehaving_agents.py:NAME`).

    always_fails                 raises before any model call, in the warm start as in training
    fails_from_the_second_batch  the example agent on the warm start's tasks and the first training batch
                                 (seeds 0, 1 of a seed-0 run with group.n_tasks=2), then raises
    slow                         the example agent, 0.2 s late; touches the file $MARKER on its first call
    sends_tool_calls_as_text     the example agent, but its history holds its tool calls as assistant text (as
                                 smolagents sends them), so each call's prompt re-renders the previous answer
    forces_a_tool_call           asks for a call with tool_choice "required" (as smolagents does on every call)
"""

import asyncio
import json
import os
from pathlib import Path

from openai import AsyncOpenAI

from horizonrl.tools.registry import import_target
from horizonrl.assembly.tasks import DEMO_SEED

example = import_target("examples/arithmetic_openai_agent.py:agent")
calculate = import_target("examples/arithmetic_openai_agent.py:calculate")
CALCULATOR = import_target("examples/arithmetic_openai_agent.py:CALCULATOR")


async def always_fails(task: dict, base_url: str) -> float:
    raise RuntimeError("the agent's search tool is down")


async def fails_from_the_second_batch(task: dict, base_url: str) -> float:
    if 2 <= task["seed"] < DEMO_SEED:
        raise RuntimeError("the agent's search tool is down")
    return await example(task, base_url)


async def slow(task: dict, base_url: str) -> float:
    Path(os.environ["MARKER"]).touch()
    await asyncio.sleep(0.2)
    return await example(task, base_url)


async def forces_a_tool_call(task: dict, base_url: str) -> float:
    async with AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
        await client.chat.completions.create(model="policy", messages=task["messages"], tools=[CALCULATOR],
                                             tool_choice="required")
    return 1.0


async def sends_tool_calls_as_text(task: dict, base_url: str) -> float:
    """One calculator call, then the answer; the call goes back into the history as text, not `tool_calls`."""
    messages = list(task["messages"])
    async with AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
        first = (await client.chat.completions.create(model="policy", messages=messages,
                                                      tools=[CALCULATOR])).choices[0].message
        if not first.tool_calls:
            return 0.0
        call = first.tool_calls[0]
        text = f"Calling tools:\n{call.function.name}({call.function.arguments})"
        messages.append({"role": "assistant", "content": text})
        try:
            expression = json.loads(call.function.arguments).get("expression", "")
        except (json.JSONDecodeError, AttributeError):
            expression = ""
        messages.append({"role": "user", "content": f"Observation: {calculate(str(expression))}"})
        answer = (await client.chat.completions.create(model="policy", messages=messages,
                                                       tools=[CALCULATOR])).choices[0].message.content or ""
    return float(answer.strip() == f"The answer is {task['data']['answer']}.")
