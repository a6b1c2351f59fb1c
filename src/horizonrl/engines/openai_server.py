"""Engine over a running OpenAI-compatible server that returns token ids (vLLM's `vllm serve` / api_server,
SGLang), for users who serve the model themselves.

Prompts go in as token ids (`/v1/completions` takes a list of ids) and the sampled ids come back
(vLLM's `return_token_ids`), with the sampled tokens' log-probs (`logprobs: 0`): nothing is ever
re-tokenised. A server that returns no token ids is refused when the engine starts. Only our stop
ids end a response (`stop_token_ids`, `ignore_eos`); stop patterns are checked once it ends. Each
request carries a seed from `RequestSeeds`. For log-probs after temperature (what the learner computes)
start vLLM with `--logprobs-mode processed_logprobs`. A request's `grammar` is sent as vLLM's structured
outputs, `"structured_outputs": {"grammar": ...}` (the field of vLLM 0.32's completions API; the log-probs
are then those of the masked distribution, see engines/vllm_engine.py).

Weight sync (training): the learner writes its weights to `weights_dir` (engines/weights.py: untied
embeddings; the server must read that folder and should have been started from such a folder) and
asks the server (vLLM with VLLM_SERVER_DEV_MODE=1) to take them while rollouts may be in flight
(asynchronous training): `POST /pause?mode=keep` (no engine step runs; requests are kept, new ones
queue), `POST /collective_rpc {"method": "reload_weights"}` (in place), `POST
/reset_prefix_cache?reset_running_requests=true` (the old weights' KV goes, the requests in flight are
preempted and recompute their prompt and tokens so far with the new weights), `POST /resume`. A reset
the server reports failed is an error (never a stale cache kept). A server without `/collective_rpc`
can serve `eval` but not `train`: the engine refuses it at start. One without the keep pause (`/pause` with
`mode=keep`: vLLM from 2026-02; before, `/pause` aborted or drained the requests in flight, and before
2025-11 there was none) trains synchronously only, where no request runs at a sync: it reloads and resets its
prefix cache without a pause. Asynchronous training (`updates_in_flight`) refuses such a server at start.
A response that ended otherwise than by a stop or its length (vLLM's "abort") is not a whole response: a
RuntimeError, retried (`finish_reason`, engines/base.py, as for the in-process vLLM engine).

Failures: a refused or dropped connection, a timeout or a 5xx answer is an OSError / RuntimeError,
which `generate_with_retry` retries with back-off and then stops the run with an EngineError; every
message names the URL. A 4xx answer (a bad request) is a ValueError, not retried.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import httpx

from horizonrl.engines.base import (Generation, RequestSeeds, SamplingParams, ScoredRow, check_grammar,
                                    cut_at_stop_pattern, finish_reason)
from horizonrl.engines.retry import EngineError
from horizonrl.engines.weights import write_untied


class OpenAIServerEngine:
    """Engine over the OpenAI-compatible server at `base_url` (its /v1 URL); see the module docstring.
    `weights_dir`: where `sync_weights` writes the weights for the server to reload (None: the engine
    cannot sync, as for eval). `model`: the served model's name (None: the first of /v1/models).
    `updates_in_flight`: weights change while requests run (asynchronous training); the server must pause."""

    def __init__(self, tokenizer, base_url: str, api_key: str | None = None, model: str | None = None,
                 timeout_s: float = 300.0, seed: int = 0, weights_dir: str | Path | None = None,
                 updates_in_flight: bool = False):
        self.tokenizer = tokenizer
        self.base_url = base_url.rstrip("/")
        self.root_url = self.base_url.removesuffix("/v1")
        api_key = api_key or os.environ.get("OPENAI_API_KEY")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = httpx.Timeout(timeout_s, connect=10.0)
        self.seeds = RequestSeeds(seed)
        self._lock = threading.Lock()   # guards seeds and _in_flight: a sync comes from the learner's thread
        self._in_flight = 0             # requests sent and not yet answered
        self.in_flight_at_sync = 0      # requests in flight when the weights last changed
        self.weights_dir = Path(weights_dir) if weights_dir is not None else None
        self.model = model or self._first_model()
        self._check_token_ids()
        self._pauses = self.weights_dir is not None and self._check_reload_route()
        if updates_in_flight and not self._pauses:
            raise EngineError(f"the server at {self.root_url} cannot pause with its requests kept (POST "
                              "/pause?mode=keep, vLLM from 2026-02): asynchronous training changes its weights while "
                              "requests run. Upgrade vLLM, or train synchronously "
                              "(rollout.async_training.max_staleness=0)")

    def _call(self, method: str, url: str, json: dict | None = None) -> dict:
        """A blocking call (start-up and weight sync); EngineError naming the URL when it fails."""
        try:
            response = httpx.request(method, url, json=json, headers=self.headers, timeout=self.timeout)
        except httpx.HTTPError as error:
            raise EngineError(f"no answer from the OpenAI-compatible server at {url}: {type(error).__name__}: "
                              f"{error}") from None
        if response.status_code >= 400:
            raise EngineError(f"{url} answered {response.status_code}: {response.text[:300]}")
        return response.json() if response.content else {}

    def _first_model(self) -> str:
        models = self._call("GET", f"{self.base_url}/models").get("data") or []
        if not models:
            raise EngineError(f"{self.base_url}/models lists no model")
        return models[0]["id"]

    def _check_token_ids(self) -> None:
        """One-token probe: the server must return the sampled ids (we never re-tokenise)."""
        probe = self.tokenizer.encode("probe", add_special_tokens=False) or [0]
        choice = self._call("POST", f"{self.base_url}/completions", self._body(probe, SamplingParams(max_tokens=1), 0))
        choice = choice["choices"][0]
        if not isinstance(choice.get("token_ids"), list) or not (choice.get("logprobs") or {}).get("token_logprobs"):
            raise EngineError(f"the server at {self.base_url} returns no token ids or log-probs with its completions "
                              "(it needs vLLM's return_token_ids): horizonrl trains on exact ids, never re-tokenised")

    def _check_reload_route(self) -> bool:
        """EngineError unless the server can reload weights; returns whether it can pause its engine with the
        requests kept (its /pause takes mode=keep, and it has /resume)."""
        paths = self._call("GET", f"{self.root_url}/openapi.json").get("paths", {})
        if "/collective_rpc" not in paths:
            raise EngineError(f"the server at {self.root_url} cannot take new weights (no /collective_rpc route): "
                              "start vLLM with VLLM_SERVER_DEV_MODE=1 to train with it (eval works as it is)")
        pause = paths.get("/pause", {}).get("post", {}).get("parameters", [])
        keeps = any(p.get("name") == "mode" and "keep" in p.get("schema", {}).get("enum", []) for p in pause)
        return keeps and "/resume" in paths

    def _body(self, prompt_ids: list[int], params: SamplingParams, seed: int) -> dict:
        body = {"model": self.model, "prompt": list(prompt_ids), "max_tokens": params.max_tokens,
                "temperature": params.temperature, "top_p": params.top_p, "seed": seed, "logprobs": 0,
                "return_token_ids": True, "stop_token_ids": list(params.stop_ids), "ignore_eos": True}
        if params.grammar is not None:
            body["structured_outputs"] = {"grammar": params.grammar}
        return body

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        check_grammar(params)
        with self._lock:
            version, seed = self.seeds.version, self.seeds.next(prompt_ids, params.seed)
            self._in_flight += 1
        body = self._body(prompt_ids, params, seed)
        url = f"{self.base_url}/completions"
        try:  # a client per call: collectors run each batch in a fresh event loop
            async with httpx.AsyncClient(timeout=self.timeout, headers=self.headers) as client:
                response = await client.post(url, json=body)
        except httpx.TimeoutException as error:
            raise TimeoutError(f"{url}: no answer within {self.timeout.read} s ({type(error).__name__})") from None
        except httpx.TransportError as error:
            raise ConnectionError(f"{url}: {type(error).__name__}: {error}") from None
        finally:
            with self._lock:
                self._in_flight -= 1
        if response.status_code >= 500:
            raise RuntimeError(f"{url} answered {response.status_code}: {response.text[:300]}")
        if response.status_code >= 400:
            raise ValueError(f"{url} answered {response.status_code}: {response.text[:300]}")
        choice = response.json()["choices"][0]
        reason = finish_reason(choice["finish_reason"], url)
        generation = Generation(list(choice["token_ids"]), list(choice["logprobs"]["token_logprobs"]), reason, version)
        return cut_at_stop_pattern(generation, self.tokenizer, params.stop_patterns)

    def sync_weights(self, model, tensors=None) -> None:
        """Write `model`'s weights (`tensors`, see Engine.sync_weights) to `weights_dir` and have the
        server take them: pause, reload, reset the prefix cache (requests in flight preempted), resume."""
        if self.weights_dir is None:
            raise EngineError(f"this engine was built without weights_dir: it cannot send weights to {self.root_url}")
        write_untied(model, self.tokenizer, self.weights_dir, tensors=tensors)
        if self._pauses:
            self._call("POST", f"{self.root_url}/pause?mode=keep")
        try:
            self._call("POST", f"{self.root_url}/collective_rpc",
                       {"method": "reload_weights", "kwargs": {"weights_path": str(self.weights_dir.resolve())}})
            preempt = "?reset_running_requests=true" if self._pauses else ""   # only a paused engine stays sound
            reset = self._call("POST", f"{self.root_url}/reset_prefix_cache{preempt}")
            if reset.get("success") is False:
                raise EngineError(f"the server at {self.root_url} could not reset its prefix cache after a weight "
                                  "update (blocks still held): the old weights' KV would be reused")
        finally:
            if self._pauses:
                self._call("POST", f"{self.root_url}/resume")
        with self._lock:
            self.in_flight_at_sync = self._in_flight
            self.seeds.new_version()

    def score(self, rows: list[ScoredRow]) -> list[list[float]]:
        """As TrainingEngine.score: the server's prompt log-probs (vLLM's `prompt_logprobs`) of each row, prompt
        and response sent as one prompt at temperature 1; EngineError from a server that returns none."""
        scored = []
        for row in rows:
            body = {"model": self.model, "prompt": row.prompt_ids + row.response_ids, "max_tokens": 1,
                    "temperature": 1.0, "prompt_logprobs": 0, "return_token_ids": True}
            entries = self._call("POST", f"{self.base_url}/completions", body)["choices"][0].get("prompt_logprobs")
            if not entries:
                raise EngineError(f"the server at {self.base_url} returns no prompt log-probs (vLLM's "
                                  "prompt_logprobs): the served-policy check scores rows with them "
                                  "(rollout.sync_check.max_growth: null turns the check off)")
            tail = entries[-len(row.response_ids):]
            scored.append([entry[str(token)]["logprob"] for entry, token in zip(tail, row.response_ids)])
        return scored

    def sleep(self) -> None:
        """Nothing to free here: the server holds its own memory."""

    @property
    def weights_version(self) -> int:
        return self.seeds.version

    def state_dict(self) -> dict:
        return {"weights_version": self.weights_version}

    def load_state_dict(self, state: dict) -> None:
        self.seeds.new_version(state["weights_version"])

    def close(self) -> None:
        """Nothing to stop: the server is the user's."""
