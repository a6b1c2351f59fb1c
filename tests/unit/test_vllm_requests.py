"""How the vLLM engine's worker adds the requests that arrived (`add_requests`) and settles the ones that ended
(`_run`), without vLLM: a request the engine refuses fails alone, with an error that names a prompt too long
only when it is, an engine failure leaves every arrival where the worker settles it, and a response vLLM
aborted fails its request instead of training as a whole response."""

import asyncio
import threading
from types import SimpleNamespace

import pytest

from horizonrl.engines.base import Generation
from horizonrl.engines.retry import is_transient
from horizonrl.engines.vllm_engine import VLLMEngine, add_requests


class Refused(Exception):
    """Stands in for vLLM's VLLMClientError."""


BAD_GRAMMAR = "a grammar vLLM cannot compile"


class Engine:
    """vLLM's LLMEngine as add_requests sees it: refuses, as vLLM 0.32 does, a prompt with no room left for
    one response token in max_model_len, and the sampling parameters BAD_GRAMMAR; fails outright on the
    request `broken_on`."""

    model_config = SimpleNamespace(max_model_len=8)

    def __init__(self, broken_on: str | None = None):
        self.added: list[str] = []
        self.broken_on = broken_on

    def add_request(self, request_id, prompt, sampling):
        if request_id == self.broken_on:
            raise RuntimeError("engine core died")
        if len(prompt["prompt_token_ids"]) >= self.model_config.max_model_len:
            raise Refused(f"prompt of {len(prompt['prompt_token_ids'])} tokens")
        if sampling == BAD_GRAMMAR:
            raise Refused("Invalid grammar specification.")
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
    assert "9-token prompt (max_model_len is 8" in str(error) and "rollout.vllm.max_model_len" in str(error)


def test_an_engine_failure_leaves_every_arrival_to_be_settled():
    async def run():
        running, arrived = {}, arrivals([2, 3, 4])
        with pytest.raises(RuntimeError, match="engine core died"):
            add_requests(Engine(broken_on="1"), arrived, running, Refused)
        return running

    assert set(asyncio.run(run())) == {"0", "1", "2"}   # the later arrival "2" too: the worker settles them all


def refusals(make_arrivals) -> list[Exception]:
    """The errors add_requests settles the futures of `make_arrivals()` with (each one refused by Engine)."""
    async def run():
        arrived = make_arrivals()
        add_requests(Engine(), arrived, {}, Refused)
        await asyncio.sleep(0)
        return [future for *_, future, _ in arrived]

    return [future.exception() for future in asyncio.run(run())]


def test_a_prompt_of_max_model_len_tokens_is_too_long_since_the_response_needs_one():
    """8 prompt tokens + at least 1 response token > max_model_len 8: named as too long, with the key to raise."""
    (error,) = refusals(lambda: arrivals([8]))
    assert type(error) is ValueError and not is_transient(error)
    assert "8-token prompt (max_model_len is 8" in str(error) and "rollout.vllm.max_model_len" in str(error)


def test_a_request_refused_for_another_cause_passes_vllms_message_on_and_does_not_blame_the_prompt():
    """A 3-token prompt fits max_model_len 8; vLLM refuses its grammar: the error says so, and names the request."""
    (error,) = refusals(lambda: [("5", [1, 2, 3], BAD_GRAMMAR, asyncio.get_running_loop().create_future(), 0)])
    assert type(error) is ValueError and not is_transient(error)
    assert str(error) == ("vLLM refused request 5 (a 3-token prompt, within max_model_len): "
                          "Invalid grammar specification.")


class Stepping:
    """vLLM's LLMEngine as the worker (`VLLMEngine._run`) sees it: each request it is given ends at the first
    step, sampling token 7 (log-prob -0.5), with the finish reason `reasons` gives its id."""

    def __init__(self, reasons: dict[str, str]):
        self.reasons, self.added = reasons, []

    def add_request(self, request_id, prompt, sampling):
        self.added.append(request_id)

    def step(self):
        added, self.added = self.added, []
        return [SimpleNamespace(request_id=request_id, finished=True, outputs=[SimpleNamespace(
            token_ids=[7], logprobs=[{7: SimpleNamespace(logprob=-0.5)}], finish_reason=self.reasons[request_id])])
            for request_id in added]


def test_a_response_vllm_aborted_fails_its_request_and_the_others_are_whole():
    """vLLM's "abort" (and "error") end a response that is not whole: before, the worker mapped every reason
    but "length" to "stop", so it trained as a whole response. Now its request fails alone, with a transient
    error (generate_with_retry retries it); "stop" and "length" responses are generations as before."""
    reasons = {"0": "stop", "1": "abort", "2": "length", "3": "error"}

    async def run():
        engine = object.__new__(VLLMEngine)   # the worker's state only: no vLLM behind it
        engine.llm = SimpleNamespace(llm_engine=Stepping(reasons))
        engine._vllm = SimpleNamespace(exceptions=SimpleNamespace(VLLMClientError=Refused))
        engine._lock, engine._stepping = threading.Lock(), threading.Lock()
        engine._pending, engine._running, engine._working = arrivals([2, 3, 4, 5]), {}, True
        futures = [future for *_, future, _ in engine._pending]
        await asyncio.to_thread(engine._run)
        await asyncio.sleep(0)
        return futures

    stop, aborted, length, failed = asyncio.run(run())
    assert stop.result() == Generation([7], [-0.5], "stop", 0)
    assert length.result() == Generation([7], [-0.5], "length", 0)
    for future, request_id, reason in ((aborted, "1", "abort"), (failed, "3", "error")):
        error = future.exception()
        assert type(error) is RuntimeError and is_transient(error)
        assert str(error).startswith(f"vLLM request {request_id}: a response ended by {reason!r}, not by a stop")
