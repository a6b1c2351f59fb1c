"""An agent that a test holds, for runs of configs/arithmetic_openai_agent.yaml
(`task.agent=tests/integration/held_agents.py:held`; tests/integration/test_stop_before_checkpoint.py).

    held    appends a line to the file $CALLS, waits until the file $RELEASE exists, then plays as the example
            agent: the test acts while the run's first calls are held, and counts the calls the run made
"""

import asyncio
import os
from pathlib import Path

from horizonrl.tools.registry import import_target

example = import_target("examples/arithmetic_openai_agent.py:agent")


async def held(task: dict, base_url: str) -> float:
    with Path(os.environ["CALLS"]).open("a") as calls:
        calls.write("called\n")
    release = Path(os.environ["RELEASE"])
    while not release.exists():
        await asyncio.sleep(0.01)
    return await example(task, base_url)
