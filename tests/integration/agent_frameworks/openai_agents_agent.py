"""The arithmetic agent with the OpenAI Agents SDK (openai-agents): an `Agent` with one `function_tool`, run
by `Runner.run`, as its docs write agents for a model behind another OpenAI-compatible endpoint.

- `agent`: `OpenAIChatCompletionsModel` (Chat Completions) on the rollout's URL.
- `responses_agent`: the SDK's defaults: no model named on the Agent (the SDK's default model and settings)
  and the default provider, which calls the Responses API, given the rollout's client.
- `structured_agent`: `output_type=` a pydantic model (Chat Completions: `response_format` json_schema).
- `structured_responses_agent`: `output_type=` on the default Responses model (`text.format` json_schema).
- `streamed_agent`: `Runner.run_streamed` on the default Responses model (its event stream).

A run the model spoils (an answer that is not the output type's JSON, a tool loop past `max_turns`) raises in
the SDK; here it is a wrong answer, reward 0 (the policy should learn from it, not have it dropped).
"""

from __future__ import annotations

from agents import (Agent, MaxTurnsExceeded, ModelBehaviorError, OpenAIChatCompletionsModel, OpenAIProvider,
                    RunConfig, Runner, function_tool, set_tracing_disabled)
from openai import AsyncOpenAI
from pydantic import BaseModel

from integration.agent_frameworks.common import JSON_INSTRUCTION, calculate, reward, system_and_question

set_tracing_disabled(True)   # no trace export to OpenAI's servers


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with integers, + - * and parentheses.

    Args:
        expression: The expression, e.g. 37 * 48 + 215.
    """
    return calculate(expression)


class Answer(BaseModel):
    answer: int


async def agent(task: dict, base_url: str) -> float:
    return await solve(task, base_url, responses=False, structured=False)


async def responses_agent(task: dict, base_url: str) -> float:
    return await solve(task, base_url, responses=True, structured=False)


async def structured_agent(task: dict, base_url: str) -> float:
    return await solve(task, base_url, responses=False, structured=True)


async def structured_responses_agent(task: dict, base_url: str) -> float:
    return await solve(task, base_url, responses=True, structured=True)


async def streamed_agent(task: dict, base_url: str) -> float:
    system, question = system_and_question(task)
    async with AsyncOpenAI(base_url=base_url, api_key="unused") as client:
        solver = Agent(name="Arithmetic solver", instructions=system, tools=[calculator])
        result = Runner.run_streamed(solver, question, run_config=RunConfig(model_provider=OpenAIProvider(
            openai_client=client)))
        async for _ in result.stream_events():
            pass
    return reward(result.final_output, task)


async def solve(task: dict, base_url: str, responses: bool, structured: bool) -> float:
    """The reward of one run: on the default provider's Responses model (`responses`) or a Chat Completions
    model, with `output_type=Answer` (`structured`) or the answer as text."""
    system, question = system_and_question(task)
    async with AsyncOpenAI(base_url=base_url, api_key="unused") as client:
        model = None if responses else OpenAIChatCompletionsModel(model="policy", openai_client=client)
        typed = {"output_type": Answer} if structured else {}
        solver = Agent(name="Arithmetic solver", instructions=system + JSON_INSTRUCTION * structured,
                       tools=[calculator], model=model, **typed)
        run_config = RunConfig(model_provider=OpenAIProvider(openai_client=client)) if responses else None
        try:
            result = await Runner.run(solver, question, run_config=run_config)
        except (ModelBehaviorError, MaxTurnsExceeded):
            return 0.0
    return reward(result.final_output.answer if structured else result.final_output, task)
