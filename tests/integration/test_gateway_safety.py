"""The gateway's safety defaults, one test each: local bind, API key, every malformed or over-limit
request as a 4xx OpenAI error body, unknown rollouts, the body size limit, 500s without tracebacks, and
100 concurrent requests against the tiny model with none failing."""

import asyncio

import httpx
import openai
import pytest
import torch

from horizonrl.config import RolloutConfig
from horizonrl.gateway import Gateway, GatewayThread, Recorder
from horizonrl.learner.models import load_policy, stop_ids
from horizonrl.rollout.from_config import make_engine

KEY = "s3cret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
CONTEXT = 256
CHAT = {"model": "any", "messages": [{"role": "user", "content": "go to the red ball"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def policy():
    return load_policy("builtin:babyai-tiny", torch.device("cpu"))


@pytest.fixture(scope="module")
def gateway(policy):
    """The tiny model behind a gateway with an API key, an issued-only recorder and small limits: its
    Gateway and base URL."""
    tokenizer, model = policy
    engine = make_engine(model, tokenizer, RolloutConfig(), seed=0, device=torch.device("cpu"))
    served = Gateway(engine, tokenizer, "tiny", CONTEXT, stop_ids(tokenizer, model), Recorder(issued_only=True),
                     api_key=KEY, max_tokens_limit=64, max_n=4, max_body_bytes=64 * 1024)
    thread = GatewayThread(served)
    url = thread.start()
    yield served, url
    thread.stop()


def post(url: str, path: str, headers=AUTH, **kwargs) -> httpx.Response:
    return httpx.post(url + path, headers=headers, timeout=60, **kwargs)


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    return error


def test_binds_this_machine_only_by_default(gateway):
    assert gateway[1].startswith("http://127.0.0.1:")


def test_every_route_but_health_needs_the_key(gateway):
    _, url = gateway
    assert httpx.get(f"{url}/health").status_code == 200
    assert assert_error(httpx.get(f"{url}/v1/models"), 401)["code"] == "invalid_api_key"
    assert_error(post(url, "/v1/chat/completions", headers={"Authorization": "Bearer wrong"}, json=CHAT), 401)
    assert_error(post(url, "/v1/chat/completions", headers={"Authorization": KEY}, json=CHAT), 401)
    assert httpx.get(f"{url}/v1/models", headers=AUTH).json()["data"][0]["id"] == "tiny"
    assert post(url, "/v1/chat/completions", json=CHAT).status_code == 200


@pytest.mark.parametrize("body, param", [
    (b'{"model": "any", "messages": [', None),                       # malformed JSON
    (b'[1, 2]', None),                                               # not an object
    ({**CHAT, "max_tokens": "four"}, "max_tokens"),                  # wrong type
    ({**CHAT, "messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
    ({**CHAT, "messages": [{"role": "user", "content": "go " * CONTEXT}]}, "messages"),   # prompt over the context
    ({**CHAT, "max_tokens": 65}, "max_tokens"),                      # over the server's limit
    ({**CHAT, "max_tokens": 60, "messages": [{"role": "user", "content": "go " * 200}]}, "max_tokens"),  # + prompt
    ({**CHAT, "n": 5}, "n"),
    ({**CHAT, "logit_bias": {"7": 5}}, "logit_bias"),                # unsupported options
    ({**CHAT, "tool_choice": "required"}, "tool_choice"),
    ({**CHAT, "top_logprobs": 3, "logprobs": True}, "top_logprobs"),
])
def test_bad_requests_are_400_with_an_error_body(gateway, body, param):
    _, url = gateway
    sent = {"content": body} if isinstance(body, bytes) else {"json": body}
    error = assert_error(post(url, "/v1/chat/completions", **sent), 400, param)
    assert error["type"] == "invalid_request_error"


def test_completions_limits(gateway):
    _, url = gateway
    assert_error(post(url, "/v1/completions", json={"prompt": [5] * CONTEXT}), 400, "prompt")
    assert_error(post(url, "/v1/completions", json={"prompt": ["a", "b"]}), 400, "prompt")
    assert_error(post(url, "/v1/completions", json={"prompt": "go", "echo": True}), 400, "echo")


def test_unknown_routes_and_methods(gateway):
    served, url = gateway
    errors = served.stats["errors"]
    assert_error(httpx.get(f"{url}/v2/engines", headers=AUTH), 404)
    assert_error(httpx.get(f"{url}/v1/chat/completions", headers=AUTH), 405)
    assert served.stats["errors"] == errors + 2


def test_only_issued_rollouts_are_served(gateway):
    served, url = gateway
    assert_error(post(url, "/rollouts/never-issued/v1/chat/completions", json=CHAT), 404, "rollout_id")
    assert_error(post(url, "/rollouts/never-issued/reward", json={"reward": 1}), 404)
    served.recorder.issue("r1")
    assert post(url, "/rollouts/r1/v1/chat/completions", json=CHAT).status_code == 200
    assert post(url, "/rollouts/r1/reward", json={"reward": 0.5}).status_code == 200
    assert_error(post(url, "/rollouts/r1/reward", json={"score": 1}), 400)
    assert_error(post(url, "/rollouts/r1/reward", json={}), 400)
    rollout = served.recorder.take("r1")
    assert [call.index for call in rollout.calls] == [0] and rollout.reward == 0.5
    assert_error(post(url, "/rollouts/r1/v1/chat/completions", json=CHAT), 404)


def test_a_body_over_the_limit_is_413(gateway):
    _, url = gateway
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 70 * 1024}]}
    assert_error(post(url, "/v1/chat/completions", json=big), 413)


class FailingEngine:
    async def generate(self, prompt_ids, params):
        raise RuntimeError("secret detail of the engine")


def test_an_engine_failure_is_a_500_without_the_traceback(policy, caplog):
    tokenizer, model = policy
    served = Gateway(FailingEngine(), tokenizer, "tiny", CONTEXT, stop_ids(tokenizer, model))
    thread = GatewayThread(served)
    url = thread.start()
    try:
        response = post(url, "/v1/chat/completions", json=CHAT)
        streamed = post(url, "/v1/chat/completions", json={**CHAT, "stream": True})
    finally:
        thread.stop()
    assert response.status_code == 500
    assert response.json() == {"error": {"message": "internal server error", "type": "server_error", "param": None,
                                         "code": None}}
    assert 'data: {"error": {"message": "internal server error"' in streamed.text
    for text in (response.text, streamed.text):
        assert "secret detail" not in text and "Traceback" not in text
    assert "secret detail of the engine" in caplog.text   # logged on the server side
    assert served.stats["server_errors"] == 2


def test_100_concurrent_requests_all_succeed(gateway):
    served, url = gateway

    async def agents():
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0) as client:
            return await asyncio.gather(*(client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": f"go to the ball number {i}"}], max_tokens=8,
                seed=i) for i in range(100)))

    errors = served.stats["errors"] + served.stats["server_errors"]
    responses = asyncio.run(agents())
    assert len(responses) == 100 and all(1 <= len(r.choices[0].token_ids) <= 8 for r in responses)
    assert served.stats["errors"] + served.stats["server_errors"] == errors
