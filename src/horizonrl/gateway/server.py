"""An OpenAI-compatible HTTP server over our engine that records the exact tokens of every call.

Agents written against the OpenAI API talk to it unchanged; each choice's prompt and response ids and
log-probs go to the `Recorder`, under the rollout whose URL the agent was given:

    POST /v1/chat/completions, POST /v1/completions, POST /v1/responses, GET /v1/models
                                                                        (recorded without a rollout)
    the same under /rollouts/{rollout_id}/v1/...                        (recorded under rollout_id)
    the same under /rollouts/{rollout_id}/agents/{agent}/v1/...         (under rollout_id, as that agent's: a
                                                                        program of several agents, one URL each)
    POST /rollouts/{rollout_id}/reward   {"reward": x} and/or {"call_rewards": {"<call index>": x}}
    POST /rollouts/{rollout_id}/agents/{agent}/reward   {"reward": x}: that agent's
    GET /health                                                         (no API key needed)

Why aiohttp: its request body limit (`client_max_size`), server-sent events (`StreamResponse`), and
`AppRunner`/`TCPSite`, which serve inside an event loop that is already running, on port 0 if asked:
one dependency and no separate ASGI server.

Safety: binds 127.0.0.1 unless told otherwise; with an API key every route but /health needs
`Authorization: Bearer KEY`; bodies over `max_body_bytes` get 413; every error is an OpenAI error body;
an unexpected exception is a 500 saying only "internal server error" (the traceback is logged here).

Streaming (`stream: true`): the engine returns whole responses, so each choice's chunks are sent at once
when that choice is complete (choices in the order they complete, each chunk naming its `index`); a Responses
API response's events all go out when it is sampled. An unknown route's 404 lists the routes served.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from aiohttp import web
from pydantic import BaseModel, ConfigDict, ValidationError

from horizonrl.config import RolloutConfig
from horizonrl.engines.base import Generation, SamplingParams, SeedRepeats
from horizonrl.gateway.openai_api import (Answer, ChatRequest, CompletionRequest, RequestError, ServedModel,
                                          answer, asked_max_tokens, choice_chunks, choice_dict, choice_params,
                                          error_body, logprobs_of, parse_request, prompt_of, response_header, usage)
from horizonrl.gateway.recorder import Call, Recorder
from horizonrl.gateway.responses_api import (ResponseStore, chat_request, input_messages, output_items,
                                             parse_responses_request, response_events, response_object)
from horizonrl.learner.device import resolve_device
from horizonrl.learner.models import load_policy, stop_ids
from horizonrl.rollout.from_config import make_engine

logger = logging.getLogger(__name__)
REWARD_USAGE = 'send {"reward": x} and/or {"call_rewards": {"<call index>": x}}'
INTERNAL_ERROR = {"error": {"message": "internal server error", "type": "server_error", "param": None, "code": None}}


class _RewardBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reward: float | None = None
    call_rewards: dict[int, float] | None = None


class Gateway:
    """Serves `engine` (sampling ids for `tokenizer`) as the model `model_name` and records every call.

    The engine's `generate` is awaited on the event loop that runs `start` only. A call goes on when its
    client gives up (aiohttp does not cancel handlers): `calls_over` awaits those of a rollout. `stats` counts
    requests (all but /health), errors (4xx answers), server_errors (5xx), tool_call_parse_failures
    (responses with a `<tool_call>` block that does not parse; they are returned as plain content) and
    max_tokens_capped (requests for more than `max_tokens_limit` tokens given that many: `cap_max_tokens`,
    as training does; else they are refused) and fixed_seed_repeats (rollouts' choices that repeat the prompt
    and `seed` of one sampled earlier at the same weights, so sample its response again: `SeedRepeats`; the
    first is logged). `constraint_refusal`: see ServedModel."""

    def __init__(self, engine, tokenizer, model_name: str, context_len: int, stop_ids: tuple[int, ...],
                 recorder: Recorder | None = None, api_key: str | None = None, max_tokens_limit: int = 1024,
                 max_n: int = 8, max_body_bytes: int = 4 * 1024 * 1024, cap_max_tokens: bool = False,
                 constraint_refusal: str | None = None):
        self.engine = engine
        self.model = ServedModel(tokenizer, model_name, context_len, tuple(stop_ids), max_tokens_limit, max_n,
                                 cap_max_tokens, constraint_refusal)
        self.recorder = recorder or Recorder()
        self.api_key = api_key
        self.stats = {"requests": 0, "errors": 0, "server_errors": 0, "tool_call_parse_failures": 0,
                      "max_tokens_capped": 0, "fixed_seed_repeats": 0}
        self.seed_repeats = SeedRepeats()
        self.responses = ResponseStore()
        self.app = web.Application(client_max_size=max_body_bytes, middlewares=[self._guard])
        for prefix in ("", "/rollouts/{rollout_id}", "/rollouts/{rollout_id}/agents/{agent}"):
            self.app.router.add_post(prefix + "/v1/chat/completions", self._chat)
            self.app.router.add_post(prefix + "/v1/completions", self._completions)
            self.app.router.add_post(prefix + "/v1/responses", self._responses)
            self.app.router.add_get(prefix + "/v1/models", self._models)
        self.app.router.add_post("/rollouts/{rollout_id}/reward", self._reward)
        self.app.router.add_post("/rollouts/{rollout_id}/agents/{agent}/reward", self._reward)
        self.app.router.add_get("/health", self._health)
        self._runner: web.AppRunner | None = None
        self._in_flight: dict[str, set[asyncio.Future]] = {}   # rollout id -> the ends of its model calls

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on host:port (0: a free port) from the running event loop; returns "http://host:port"."""
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        return f"http://{host}:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def calls_over(self, rollout_id: str) -> None:
        """Returns once no model call of `rollout_id` is in flight (each ends as it would have, its
        generation whole), its stored responses forgotten. Take the rollout from the recorder first: then no
        new call is accepted."""
        await asyncio.gather(*self._in_flight.get(rollout_id, ()))
        self.responses.forget(rollout_id)

    @contextlib.contextmanager
    def _call(self, rollout_id: str | None):
        """A model call of `rollout_id` is in flight inside this block (for `calls_over`). Entered in the
        event loop step that accepted the rollout id, so no call is accepted unseen by `calls_over`."""
        if rollout_id is None:
            yield
            return
        ended = asyncio.get_running_loop().create_future()
        self._in_flight.setdefault(rollout_id, set()).add(ended)
        try:
            yield
        finally:
            ended.set_result(None)
            calls = self._in_flight[rollout_id]
            calls.discard(ended)
            if not calls:
                del self._in_flight[rollout_id]

    @web.middleware
    async def _guard(self, request: web.Request, handler) -> web.StreamResponse:
        """API key check, and every failure as an OpenAI error body (500s without their traceback)."""
        public = request.path == "/health"
        self.stats["requests"] += not public
        try:
            if self.api_key is not None and not public and not self._authorised(request):
                raise RequestError("invalid or missing API key (send Authorization: Bearer KEY)",
                                   code="invalid_api_key", status=401)
            response = await handler(request)
        except RequestError as error:
            response = web.json_response(error_body(error.message, param=error.param, code=error.code),
                                         status=error.status)
        except (web.HTTPNotFound, web.HTTPMethodNotAllowed) as error:
            response = web.json_response(error_body(f"{error.reason}: {request.method} {request.path}; this server "
                                                    f"serves {', '.join(self._routes())}"), status=error.status)
        except web.HTTPException as error:   # aiohttp's own: body too large
            response = web.json_response(error_body(error.text or error.reason), status=error.status)
        except Exception:
            logger.exception("gateway: %s %s failed", request.method, request.path)
            response = web.json_response(INTERNAL_ERROR, status=500)
        self.stats["errors"] += 400 <= response.status < 500
        self.stats["server_errors"] += response.status >= 500
        return response

    def _routes(self) -> list[str]:
        """Every route served, as "METHOD path"."""
        return [f"{route.method} {route.resource.canonical}" for route in self.app.router.routes()
                if route.method != "HEAD"]

    def _authorised(self, request: web.Request) -> bool:
        sent = request.headers.get("Authorization", "").encode()
        return hmac.compare_digest(sent, f"Bearer {self.api_key}".encode())

    def _rollout_id(self, request: web.Request) -> str | None:
        """The rollout the request belongs to (None on the plain routes); 404 for one not accepted."""
        rollout_id = request.match_info.get("rollout_id")
        if rollout_id is not None and not self.recorder.accepts(rollout_id):
            raise RequestError(f"unknown rollout {rollout_id!r}", param="rollout_id", code="unknown_rollout",
                               status=404)
        return rollout_id

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _models(self, request: web.Request) -> web.Response:
        self._rollout_id(request)
        return web.json_response({"object": "list", "data": [
            {"id": self.model.name, "object": "model", "created": 0, "owned_by": "horizonrl"}]})

    async def _reward(self, request: web.Request) -> web.Response:
        rollout_id = self._rollout_id(request)
        try:
            body = _RewardBody.model_validate_json(await request.read())
        except ValidationError as error:
            raise RequestError(f"reward body: {error.errors()[0]['msg']} ({REWARD_USAGE})") from None
        if body.reward is None and body.call_rewards is None:
            raise RequestError(f"reward body: no reward ({REWARD_USAGE})")
        agent = request.match_info.get("agent")
        if agent is not None and (body.call_rewards is not None or body.reward is None):
            raise RequestError('an agent\'s reward body: send {"reward": x}; call rewards go to the rollout\'s '
                               "/reward")
        try:
            self.recorder.set_reward(rollout_id, body.reward, body.call_rewards, agent)
        except KeyError as error:
            raise RequestError(str(error.args[0]), param="call_rewards") from None
        return web.json_response({"status": "ok"})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completions")

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "responses")

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        rollout_id = self._rollout_id(request)
        with self._call(rollout_id):
            if kind == "responses":
                return await self._serve_response(request, rollout_id)
            return await self._serve_call(request, kind, rollout_id)

    async def _serve_call(self, request: web.Request, kind: str, rollout_id: str | None) -> web.StreamResponse:
        started = time.time()
        body = parse_request(await request.read(), kind)
        prompt_ids, messages = prompt_of(body, self.model)
        tasks = [asyncio.ensure_future(self._sample(prompt_ids, params, rollout_id))
                 for params in self._choice_params(body, len(prompt_ids))]
        if body.stream:
            return await self._stream(request, body, prompt_ids, tasks, lambda results: self._record(
                rollout_id, request.match_info.get("agent"), body, prompt_ids, messages, results, started))
        try:
            generations = await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
        results = [(generation, self._answer(body, generation)) for generation in generations]
        self._record(rollout_id, request.match_info.get("agent"), body, prompt_ids, messages, results, started)
        response = response_header(body, self.model, int(started))
        response["choices"] = [choice_dict(body, i, reply, generation, self.model.tokenizer)
                               for i, (generation, reply) in enumerate(results)]
        response["usage"] = usage(len(prompt_ids), generations)
        response["prompt_token_ids"] = prompt_ids
        return web.json_response(response)

    async def _serve_response(self, request: web.Request, rollout_id: str | None) -> web.StreamResponse:
        """The Responses API: served as the chat request it amounts to (responses_api.py), stored for a later
        `previous_response_id` unless `store` is false."""
        started = time.time()
        body = parse_responses_request(await request.read())
        conversation = self.responses.conversation(body.previous_response_id) + input_messages(body)
        chat = chat_request(body, conversation)
        prompt_ids, messages = prompt_of(chat, self.model)
        [params] = self._choice_params(chat, len(prompt_ids))
        generation = await self._sample(prompt_ids, params, rollout_id)
        reply = self._answer(chat, generation)
        self._record(rollout_id, request.match_info.get("agent"), chat, prompt_ids, messages, [(generation, reply)],
                     started)
        items = output_items(reply.response, logprobs_of(chat, generation, self.model.tokenizer))
        response = response_object(body, self.model.name, int(started), items, reply.finish_reason, prompt_ids,
                                   generation.token_ids)
        if body.store:
            self.responses.keep(rollout_id, response["id"], conversation + [reply.response])
        if not body.stream:
            return web.json_response(response)
        stream = await _event_stream(request)
        for event in response_events(response):
            await _send_event(stream, event, event["type"])
        return stream

    async def _sample(self, prompt_ids: list[int], params: SamplingParams, rollout_id: str | None) -> Generation:
        """The engine's generation; a rollout's that repeats an earlier one's prompt and fixed seed at its weights
        is counted (and the first logged). On the plain routes a fixed seed is a client's ask for the same answer."""
        generation = await self.engine.generate(prompt_ids, params)
        if rollout_id is not None and self.seed_repeats.repeats(prompt_ids, params.seed, generation.weights_version):
            self.stats["fixed_seed_repeats"] += 1
            if self.stats["fixed_seed_repeats"] == 1:
                logger.warning("gateway: a rollout's request repeated the prompt and fixed seed (seed=%d) of an "
                               "earlier one at the same weights, so it sampled the same response: agents that send a "
                               "fixed seed make the rollouts of a group identical and their group advantages zero; "
                               "drop `seed` from the agent's requests (counted in gateway/fixed_seed_repeats, logged "
                               "once)", params.seed)
        return generation

    def _choice_params(self, body: ChatRequest | CompletionRequest, prompt_len: int) -> list[SamplingParams]:
        """`choice_params`, counting (and logging the first) max_tokens capped at the server's limit."""
        asked = asked_max_tokens(body)
        if self.model.cap_max_tokens and asked is not None and asked > self.model.max_tokens:
            self.stats["max_tokens_capped"] += 1
            if self.stats["max_tokens_capped"] == 1:
                logger.warning("gateway: an agent asked for max_tokens=%d; capped at this run's %d "
                               "(rollout.max_tokens; counted in gateway/max_tokens_capped, logged once)",
                               asked, self.model.max_tokens)
        return choice_params(body, prompt_len, self.model)

    async def _stream(self, request: web.Request, body: ChatRequest | CompletionRequest, prompt_ids: list[int],
                      tasks: list[asyncio.Future],
                      record: Callable[[list[tuple[Generation, Answer]]], None]) -> web.StreamResponse:
        """Server-sent events: each choice's chunks when it completes, then (every choice done) `record`
        of the (generation, answer) pairs, the usage chunk (if asked for) and `[DONE]`. A failure after the
        headers went out ends the stream with an error event."""
        response = await _event_stream(request)
        header = response_header(body, self.model, int(time.time()), stream=True)
        extra = {"prompt_token_ids": prompt_ids}   # on the first chunk only

        async def indexed(index: int, task: asyncio.Future):
            return index, await task

        results = {}
        try:
            for next_done in asyncio.as_completed([indexed(i, task) for i, task in enumerate(tasks)]):
                index, generation = await next_done
                results[index] = generation, self._answer(body, generation)
                for entry in choice_chunks(body, index, results[index][1], generation, self.model.tokenizer):
                    await _send_event(response, {**header, "choices": [entry], **extra})
                    extra = {}
            record([results[i] for i in range(len(tasks))])
            if body.stream_options is not None and body.stream_options.include_usage:
                generations = [results[i][0] for i in range(len(tasks))]
                await _send_event(response, {**header, "choices": [], "usage": usage(len(prompt_ids), generations)})
            await response.write(b"data: [DONE]\n\n")
        except Exception:
            logger.exception("gateway: streamed %s failed", request.path)
            self.stats["server_errors"] += 1
            with contextlib.suppress(ConnectionError):   # the client may be gone
                await _send_event(response, INTERNAL_ERROR)
        finally:
            for task in tasks:
                task.cancel()
        return response

    def _answer(self, body: ChatRequest | CompletionRequest, generation: Generation) -> Answer:
        reply = answer(body, generation, self.model.tokenizer)
        if reply.tool_call_parse_failed:
            self.stats["tool_call_parse_failures"] += 1
            logger.debug("gateway: a response's <tool_call> block does not parse; returned as content: %r",
                         reply.response["content"][:200])
        return reply

    def _record(self, rollout_id: str | None, agent: str | None, body: ChatRequest | CompletionRequest,
                prompt_ids: list[int], messages: list[dict] | None, results: list[tuple[Generation, Answer]],
                started: float) -> None:
        """One Call per choice (`agent`'s, on an agent's URL), at consecutive indices of the rollout."""
        first, finished = self.recorder.next_index(rollout_id), time.time()
        for k, (generation, reply) in enumerate(results):
            self.recorder.record(Call(rollout_id, first + k, messages, getattr(body, "tools", None), prompt_ids,
                                      generation.token_ids, generation.logprobs, reply.finish_reason, reply.response,
                                      generation.weights_version, started, finished, reply.tool_call_parse_failed,
                                      agent=agent))


async def _event_stream(request: web.Request) -> web.StreamResponse:
    """A server-sent-events response to `request`, its headers sent."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    return response


async def _send_event(response: web.StreamResponse, data: dict, event: str | None = None) -> None:
    """One server-sent event: `data` as JSON, named `event` (the Responses API names its events)."""
    await response.write((f"event: {event}\n" if event else "").encode() + f"data: {json.dumps(data)}\n\n".encode())


class GatewayThread:
    """Runs `gateway` on its own event loop in a daemon thread, so that a caller whose code runs in other
    event loops (the trainer) can serve it: `start()` returns the base URL, `stop()` shuts it down.

    No event loop runs in this thread while it collects garbage (Python collects in whichever thread allocates: the
    agents' garbage too). A finaliser that schedules its cleanup on the running loop, as an unclosed
    openai.AsyncOpenAI does (its `aclose()`), finds none. Run on this loop, that `aclose()` closed the client's
    connection by its socket's file descriptor number, which the collection had freed and the agents' loop had
    since given a new connection: it unregistered that connection's reads, and its agent waited for an answer it
    never read until its timeout."""

    def __init__(self, gateway: Gateway, host: str = "127.0.0.1", port: int = 0):
        self.gateway, self.host, self.port = gateway, host, port
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name="horizonrl-gateway", daemon=True)
        self._running: asyncio.AbstractEventLoop | None = None   # this thread's, during a collection here

    def _serve(self) -> None:
        gc.callbacks.append(self._no_loop_while_collecting)
        try:
            self.loop.run_forever()
        finally:
            gc.callbacks.remove(self._no_loop_while_collecting)

    def _no_loop_while_collecting(self, phase: str, info: dict) -> None:
        """A gc callback: no running loop in this thread from the start of a collection here to its end."""
        if threading.current_thread() is not self._thread:
            return
        if phase == "start":
            self._running = asyncio._get_running_loop()
            asyncio._set_running_loop(None)
        else:
            asyncio._set_running_loop(self._running)

    def start(self) -> str:
        self._thread.start()
        return asyncio.run_coroutine_threadsafe(self.gateway.start(self.host, self.port), self.loop).result()

    async def calls_over(self, rollout_id: str) -> None:
        """From another event loop: `gateway.calls_over(rollout_id)`, run on the gateway's."""
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.gateway.calls_over(rollout_id), self.loop))

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.gateway.stop(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


def serve(model_path: str, engine: str = "hf", host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          traces: Path | None = None, device: str = "auto", seed: int = 0, max_tokens: int = 1024, max_n: int = 8,
          max_model_len: int | None = None) -> None:
    """`horizonrl gateway`: load the model (a hub id, folder or builtin:NAME), serve it until Ctrl-C."""
    torch_device = resolve_device(device)
    tokenizer, model = load_policy(model_path, torch_device)
    sampler = make_engine(model, tokenizer, RolloutConfig(engine=engine), seed, torch_device)
    recorder = Recorder(traces)
    gateway = Gateway(sampler, tokenizer, model_path, max_model_len or model.config.max_position_embeddings,
                      stop_ids(tokenizer, model), recorder, api_key, max_tokens, max_n)

    async def run() -> None:
        print(f"gateway: {await gateway.start(host, port)}/v1 serving {model_path}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await gateway.stop()
            recorder.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
