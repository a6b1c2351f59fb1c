"""The scripted model behind these agents: the arithmetic task's teacher (one calculator call, then the
answer), answering the way each framework needs to end its run. It is the test double of the framework
tests and the `task.teacher` of their training runs (the tiny model's warm start).

- Before any tool result: the calculator call, as a `<tool_call>` block.
- After one: `The answer is N.`; where the prompt offers smolagents' `final_answer` tool, a call to it (a
  ToolCallingAgent ends only there); where the system prompt asks for JSON (the structured-output
  variants) or the call offers no tools after a tool result (LangGraph's structured-response call, which
  also drops the system prompt), `{"answer": N}`.

Tool results are read as the chat template renders `tool` messages (`<tool_response>` blocks) or, for
smolagents (which sends them as user messages), as its `Observation:` lines.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable

from horizonrl.records import Task
from horizonrl.tasks import arithmetic

TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", flags=re.DOTALL)
OBSERVATION = re.compile(r"Observation:\n(-?\d+)")   # smolagents' tool result (its examples use "Observation: ")


def tool_result(prompt: str) -> str | None:
    """The last tool result in the prompt, if any."""
    results = TOOL_RESPONSE.findall(prompt) or OBSERVATION.findall(prompt)
    return results[-1] if results else None


def teacher(tasks: Iterable[Task], mistake_rate: float = 0.3, seed: int = 0) -> Callable[[str], str]:
    call_calculator = arithmetic.teacher(tasks, mistake_rate, seed)

    def respond(prompt: str) -> str:
        result = tool_result(prompt)
        if result is None:
            return call_calculator(prompt)
        if '"name": "final_answer"' in prompt:
            call = {"name": "final_answer", "arguments": {"answer": f"The answer is {result}."}}
            return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        if "as a JSON object" in prompt or "<tools>" not in prompt:
            return json.dumps({"answer": int(result)}) if re.fullmatch(r"-?\d+", result) else "{}"
        return f"The answer is {result}."
    return respond


def exact_teacher(tasks: Iterable[Task]) -> Callable[[str], str]:
    """The teacher without mistakes (the framework tests' double)."""
    return teacher(tasks, mistake_rate=0.0)
