"""The arithmetic agent with LangGraph: the prebuilt ReAct agent (`create_react_agent`) over LangChain's
`ChatOpenAI` on the rollout's URL, with one `@tool`, as LangGraph's docs write it.

- `agent`: the answer is the last message's text; `streamed_agent` the same, with `ChatOpenAI(streaming=True)`
  and the graph's `astream`.
- `structured_agent`: `response_format=` a pydantic model: after the tool loop the graph asks the model once
  more for the answer in that schema (`ChatOpenAI.with_structured_output`).

A run the model spoils (a tool loop past the graph's recursion limit; a structured answer that is cut short or
does not parse) raises; here it is a wrong answer, reward 0 (the policy should learn from it, not have it
dropped). LangSmith tracing is off unless LANGSMITH_TRACING is set; nothing here sets it.
"""

from __future__ import annotations

from langchain_core.exceptions import OutputParserException
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent
from openai import LengthFinishReasonError
from pydantic import BaseModel, ValidationError

from integration.agent_frameworks.common import JSON_INSTRUCTION, calculate, reward, system_and_question


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with integers, + - * and parentheses."""
    return calculate(expression)


class Answer(BaseModel):
    """The answer to the problem."""

    answer: int


async def agent(task: dict, base_url: str) -> float:
    system, question = system_and_question(task)
    model = ChatOpenAI(model="policy", base_url=base_url, api_key="unused")
    graph = create_react_agent(model, [calculator], prompt=system)
    try:
        state = await graph.ainvoke({"messages": [{"role": "user", "content": question}]})
    except GraphRecursionError:
        return 0.0
    return reward(state["messages"][-1].content, task)


async def streamed_agent(task: dict, base_url: str) -> float:
    system, question = system_and_question(task)
    model = ChatOpenAI(model="policy", base_url=base_url, api_key="unused", streaming=True)
    graph = create_react_agent(model, [calculator], prompt=system)
    state = None
    async for state in graph.astream({"messages": [{"role": "user", "content": question}]},  # noqa: B007 (the last)
                                     stream_mode="values"):
        pass
    return reward(state["messages"][-1].content, task)


async def structured_agent(task: dict, base_url: str) -> float:
    system, question = system_and_question(task)
    model = ChatOpenAI(model="policy", base_url=base_url, api_key="unused")
    graph = create_react_agent(model, [calculator], prompt=system + JSON_INSTRUCTION, response_format=Answer)
    try:
        state = await graph.ainvoke({"messages": [{"role": "user", "content": question}]})
    except (GraphRecursionError, LengthFinishReasonError, OutputParserException, ValidationError):
        return 0.0
    return reward(state["structured_response"].answer, task)
