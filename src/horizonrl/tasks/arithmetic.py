"""Arithmetic word problems that need the calculator tool, generated from a seed.

Each problem combines a product of two 2-digit numbers with a 3-digit number (hard to do reliably
in one's head), e.g. "A shop has 37 boxes of 48 pens and 215 loose pens. How many pens does it have
in all?" -> 37 * 48 + 215 = 1991. The agent should call the calculator, then reply "The answer is N."

`reward(episode)` is rule-based: 1.0 when the last response states the right integer in that form,
else 0.0. `teacher(tasks)` writes the demonstrations of the tiny model's warm start (one calculator
call, then the answer), with a deliberate share of wrong expressions so reinforcement learning has
something to improve.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterable

from horizonrl.records import Episode, Task
from horizonrl.tools.calculator import calculator

SYSTEM = ("You solve arithmetic word problems. Use the calculator tool for the computation, then reply "
          "with: The answer is N.")
TEMPLATES = [  # (question, expression) with a, b two-digit and c three-digit numbers
    ("A shop has {a} boxes of {b} pens and {c} loose pens. How many pens does it have in all?",
     "{a} * {b} + {c}"),
    ("Mia earns {a} dollars a day for {b} days and then spends {c} dollars. How many dollars does she have left?",
     "{a} * {b} - {c}"),
    ("A train runs {a} km each day for {b} days, plus {c} km on the last morning. How many km does it run?",
     "{a} * {b} + {c}"),
    ("A farm packs {a} crates of {b} apples and sells {c} apples. How many apples are left?",
     "{a} * {b} - {c}"),
]
ANSWER = re.compile(r"The answer is (-?\d+)")
QUESTION = re.compile(r"Problem: ([^\n<]*)")


def make_task(seed: int) -> Task:
    """The problem for `seed` (deterministic)."""
    rng = random.Random(seed)
    question, expression = rng.choice(TEMPLATES)
    numbers = {"a": rng.randint(12, 99), "b": rng.randint(12, 99), "c": rng.randint(100, 999)}
    expression = expression.format(**numbers)
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Problem: {question.format(**numbers)}"}]
    return Task(f"arithmetic/seed{seed}", seed, messages,
                {"expression": expression, "answer": int(calculator.fn(expression))})


def reward(episode: Episode) -> float:
    """1.0 if the last response says "The answer is N" with N the right answer, else 0.0."""
    if not episode.turns:
        return 0.0
    stated = ANSWER.search(episode.turns[-1].info.get("text", ""))
    return float(stated is not None and int(stated.group(1)) == episode.data["answer"])


def teacher(tasks: Iterable[Task], mistake_rate: float = 0.3, seed: int = 0) -> Callable[[str], str]:
    """A scripted solver for `tasks`: before any tool response it calls the calculator (with one
    operand off by a little in a `mistake_rate` share of problems), after one it states the result."""
    rng = random.Random(seed)
    expressions = {}
    for task in tasks:
        expression = task.data["expression"]
        if rng.random() < mistake_rate:
            first, rest = expression.split(" ", 1)
            expression = f"{int(first) + rng.choice([-3, -2, -1, 1, 2, 3])} {rest}"
        expressions[QUESTION.search(task.messages[-1]["content"]).group(1)] = expression

    def respond(prompt_text: str) -> str:
        responses = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", prompt_text, flags=re.S)
        if responses:
            return f"The answer is {responses[-1]}."
        question = QUESTION.search(prompt_text).group(1)
        call = json.dumps({"name": "calculator", "arguments": {"expression": expressions[question]}})
        return f"<tool_call>\n{call}\n</tool_call>"
    return respond
