"""Engine calls that fail transiently are retried with back-off; one that keeps failing stops the run
with an `EngineError` that says which request failed, how often, and why.

Retried: `RuntimeError` (a CUDA or driver error, an engine's own failure) and `OSError` (a dropped
connection, a refused one, a timeout: ConnectionError and TimeoutError are OSErrors), and asyncio's
timeout. Never retried, because the same call would fail the same way: `ValueError`, `TypeError`,
`KeyError` and other exceptions (a bad request, a programming error), and the RuntimeErrors that say
so (`NotImplementedError`, `RecursionError`) or that are already final (`EngineError`).

A retried request is sent again as it was: with `params.seed` set (the env collectors set it), HFEngine
samples the same response it would have sampled without the failure.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from horizonrl.engines.base import Engine, Generation, SamplingParams

log = logging.getLogger(__name__)
ATTEMPTS = 4
BACKOFF_S = (0.5, 1.0, 2.0)   # the wait before the 2nd, 3rd, 4th... attempt (the last one repeats)


class EngineError(RuntimeError):
    """An engine call that failed on every attempt."""


RETRIED = (RuntimeError, OSError, asyncio.TimeoutError)
NOT_RETRIED = (NotImplementedError, RecursionError, EngineError)


def is_transient(error: BaseException) -> bool:
    """Whether sending the same request again may succeed (see the module docstring)."""
    return isinstance(error, RETRIED) and not isinstance(error, NOT_RETRIED)


async def generate_with_retry(engine: Engine, prompt_ids: list[int], params: SamplingParams,
                              attempts: int = ATTEMPTS, backoff_s: Sequence[float] = BACKOFF_S
                              ) -> tuple[Generation, int]:
    """`engine.generate(prompt_ids, params)`, retried up to `attempts` calls in all while it fails
    transiently, waiting backoff_s[k - 1] seconds before retry k (the last wait repeats). Returns the
    generation and how many failed calls were retried; a warning is logged for each."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    for attempt in range(1, attempts + 1):
        try:
            return await engine.generate(prompt_ids, params), attempt - 1
        except Exception as error:
            if not is_transient(error):
                raise
            if attempt == attempts:
                raise EngineError(f"the engine failed {attempts} times in a row on a request with a "
                                  f"{len(prompt_ids)}-token prompt (max_tokens {params.max_tokens}); last error: "
                                  f"{type(error).__name__}: {error}") from error
            wait = backoff_s[min(attempt, len(backoff_s)) - 1]
            log.warning("engine call failed (attempt %d of %d, %d-token prompt), retrying in %.1f s: %s: %s",
                        attempt, attempts, len(prompt_ids), wait, type(error).__name__, error)
            await asyncio.sleep(wait)
