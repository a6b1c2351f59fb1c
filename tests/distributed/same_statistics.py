"""Whether two iterations' metrics records, one from 2 ranks and one from 1 process, agree.

Every statistic is over the global batch, so the records agree up to float summation order (relative 1e-4), but
for timings, how each rank's rows were packed (`padding_share`) and the served-policy check's probe (each rank
probes its own engine with rows of its own batch, and reports the largest rank's: assembly/sync_check.py)."""

import math

NOT_COMPARED = ("timing/", "perf/", "progress/wall_clock_s", "rollout/sync_probe_")


def assert_same_statistics(one_process: dict, two_ranks: dict) -> list[str]:
    """Asserts that the records agree; returns the keys compared."""
    compared = [key for key, value in one_process.items() if isinstance(value, (int, float))
                and not key.startswith(NOT_COMPARED) and not key.endswith("/padding_share")]
    for key in compared:
        a, b = one_process[key], two_ranks[key]
        assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6), (key, a, b)
    return compared
