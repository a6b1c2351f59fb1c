"""How the vLLM engine's worker adds the requests that arrived (`add_requests`), without vLLM: a request the
engine refuses fails alone with an error naming its length and the limit, and an engine failure leaves every
arrival where the worker settles it."""

import asyncio
from types import SimpleNamespace

import pytest

from horizonrl.engines.retry import is_transient
from horizonrl.engines.vllm_engine import add_requests


class Refused(Exception):
    """Stands in for vLLM's VLLMClientError."""


class Engine:
    """vLLM's LLMEngine as add_requests sees it: refuses prompts over max_model_len, or fails outright on
    the request `broken_on`."""

    model_config = SimpleNamespace(max_model_len=8)

    def __init__(self, broken_on: str | None = None):
        self.added: list[str] = []
        self.broken_on = broken_on

    def add_request(self, request_id, prompt, sampling):
        if request_id == self.broken_on:
            raise RuntimeError("engine core died")
        if len(prompt["prompt_token_ids"]) > self.model_config.max_model_len:
            raise Refused(f"prompt of {len(prompt['prompt_token_ids'])} tokens")
        self.added.append(request_id)


def arrivals(lengths):
    loop = asyncio.get_running_loop()
    return [(str(i), [1] * n, None, loop.create_future(), 0) for i, n in enumerate(lengths)]


def test_a_refused_request_is_settled_alone_and_the_others_run():
    async def run():
        engine, running, arrived = Engine(), {}, arrivals([2, 9, 3])
        add_requests(engine, arrived, running, Refused)
        await asyncio.sleep(0)                      # settle resolves futures on the loop, soon
        return engine, running, [future for *_, future, _ in arrived]

    engine, running, (first, refused, last) = asyncio.run(run())
    assert engine.added == ["0", "2"] and set(running) == {"0", "2"}
    assert not first.done() and not last.done()
    error = refused.exception()
    assert type(error) is ValueError and not is_transient(error)
    assert "9-token prompt (max_model_len is 8)" in str(error) and "rollout.vllm.max_model_len" in str(error)


def test_an_engine_failure_leaves_every_arrival_to_be_settled():
    async def run():
        running, arrived = {}, arrivals([2, 3, 4])
        with pytest.raises(RuntimeError, match="engine core died"):
            add_requests(Engine(broken_on="1"), arrived, running, Refused)
        return running

    assert set(asyncio.run(run())) == {"0", "1", "2"}   # the later arrival "2" too: the worker settles them all
