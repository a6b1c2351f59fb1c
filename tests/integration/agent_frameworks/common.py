"""What every framework's agent shares: the calculator the model calls (examples/arithmetic_openai_agent.py's)
and the reward of the answer. No horizonrl import: these agents are code horizonrl did not write."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

DESCRIPTION = "Evaluate an arithmetic expression with integers, + - * and parentheses."
JSON_INSTRUCTION = ' Give the final answer as a JSON object: {"answer": N}.'   # the structured-output variants
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "arithmetic_openai_agent.py"
_spec = importlib.util.spec_from_file_location("arithmetic_openai_agent", EXAMPLE)
_example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_example)
calculate = _example.calculate   # the calculator of the openai-package example agent, shared by every framework's


def system_and_question(task: dict) -> tuple[str, str]:
    """The task's system prompt and its user message (the problem)."""
    messages = task["messages"]
    return messages[0]["content"], messages[-1]["content"]


def reward(answer, task: dict) -> float:
    """1.0 if `answer` (the agent's final output: "The answer is N." text, or the number itself) is the
    task's answer, else 0.0."""
    text = str(answer).strip()
    stated = re.search(r"The answer is (-?\d+)", text) or re.fullmatch(r"(-?\d+)", text)
    return float(stated is not None and int(stated.group(1)) == task["data"]["answer"])
