"""LongSteps (gateway/agent_groups.py) counts an agent's steps that keep its event loop from others, and not the
time its thread waited for a core on a busy machine (Linux's schedstat)."""

import asyncio
import os
import subprocess
import sys
import time

import pytest

from horizonrl.gateway.agent_groups import LongSteps


def spin(seconds_of_cpu: float) -> None:
    end = time.thread_time() + seconds_of_cpu
    while time.thread_time() < end:
        pass


def counted(step) -> float:
    async def agent():
        step()
        await asyncio.sleep(0)

    blocked = [0.0]

    async def main():
        await LongSteps(agent(), blocked)

    asyncio.run(main())
    return blocked[0]


def test_a_step_that_sleeps_is_counted():
    assert counted(lambda: time.sleep(0.7)) >= 0.7


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat") or not hasattr(os, "sched_setaffinity"),
                    reason="needs Linux's schedstat and CPU affinity")
def test_a_short_step_slowed_by_a_busy_neighbour_on_its_core_is_not_counted():
    """0.3 s of CPU sharing one core with a busy process takes ~0.6 s or more of wall time (over LONG_STEP_S,
    0.5 s), half of it waiting for the core: what is left, 0.3 s, is no long step."""
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    neighbour = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\n"
                                                        "while True: pass"])
    try:
        os.sched_setaffinity(0, {cpu})
        time.sleep(0.2)                     # the neighbour is spinning
        started = time.monotonic()
        assert counted(lambda: spin(0.3)) == 0.0
        assert time.monotonic() - started > 0.5      # the step did last longer than a long step
    finally:
        os.sched_setaffinity(0, before)
        neighbour.kill()
        neighbour.wait()
