"""The arithmetic agent with smolagents: a `ToolCallingAgent` with one `@tool` over `OpenAIServerModel` on
the rollout's URL, with smolagents' defaults (its system prompt, `final_answer` tool) but for max_steps: 4, not 20,
since each step's call and observation stay in the prompt, which after ~7 steps outgrows the tiny model's 2048-token
context (smolagents' system prompt alone is ~1,000 of its tokens; a CI run had one rollout at 2111). smolagents is
synchronous: the run goes to a thread, so the other rollouts' agents are not blocked. It sends no telemetry
and reaches no hub with this model class."""

from __future__ import annotations

import asyncio

from smolagents import OpenAIServerModel, ToolCallingAgent, tool

from integration.agent_frameworks.common import calculate, reward, system_and_question

MAX_STEPS = 4     # the prompt after 4 steps: ~1,000 tokens of system prompt + 4 calls and observations < 2048


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with integers, + - * and parentheses.

    Args:
        expression: The expression, e.g. 37 * 48 + 215.
    """
    return calculate(expression)


async def agent(task: dict, base_url: str) -> float:
    return await solve(task, base_url, stream=False)


async def streamed_agent(task: dict, base_url: str) -> float:
    return await solve(task, base_url, stream=True)


async def solve(task: dict, base_url: str, stream: bool) -> float:
    """The reward of one run, in a thread; `stream`: smolagents' `stream_outputs=True` (streamed model calls)."""
    system, question = system_and_question(task)

    def run():
        model = OpenAIServerModel(model_id="policy", api_base=base_url, api_key="unused")
        return ToolCallingAgent(tools=[calculator], model=model, instructions=system, stream_outputs=stream,
                                max_steps=MAX_STEPS).run(question)

    return reward(await asyncio.to_thread(run), task)
