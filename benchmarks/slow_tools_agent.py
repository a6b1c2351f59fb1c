"""The OpenAI-API arithmetic agent (examples/arithmetic_openai_agent.py) with a calculator that takes a long-tailed
time, as a search API, a sandbox or a web tool does: the rollout-bound workload of benchmarks/async.py.

Latency model: each tool call waits min(CAP_S, X) seconds, X lognormal with median MEDIAN_S and shape SIGMA
(so the mean is MEDIAN_S * exp(SIGMA**2 / 2) and about 1 call in 20 waits over MEDIAN_S * exp(1.645 * SIGMA)),
drawn from the task's seed: every run of the benchmark waits the same times on the same tasks.
"""

import asyncio
import math
import random

from horizonrl.tools.registry import import_target

MEDIAN_S, SIGMA, CAP_S = 1.0, 1.0, 8.0
example = import_target("examples/arithmetic_openai_agent.py:agent")
calculate = import_target("examples/arithmetic_openai_agent.py:calculate")


async def agent(task: dict, base_url: str) -> float:
    draws = random.Random(task["seed"])

    async def slow_calculator(expression: str) -> str:
        await asyncio.sleep(min(CAP_S, draws.lognormvariate(math.log(MEDIAN_S), SIGMA)))
        return calculate(expression)

    return await example(task, base_url, calculator=slow_calculator)
