"""Agents written with the real agent frameworks (openai-agents, LangGraph, smolagents, LiteLLM), each with its
defaults, against the gateway: the tool round trip happens (plain, streamed, with structured output), the gateway
refuses none of the requests the framework sends, and each framework trains two iterations with the tiny model.

The agents are tests/integration/agent_frameworks/ (one module per framework, no horizonrl import); the
model is a scripted test double (agent_frameworks/teacher.py: the arithmetic task's teacher, answering the
way each framework ends its run) over the exact Qwen2.5 tokenizer. Every request body a framework sends is
logged by an aiohttp middleware added to the gateway here (printed: `pytest -rP` shows them), and a refused
one fails the test with the body and the gateway's answer. Each framework is skipped where it is not
installed: pip install openai-agents langchain-openai langgraph smolagents litellm.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import re
from dataclasses import asdict
from pathlib import Path

import pytest
from aiohttp import web

import horizonrl.assembly.tasks as train_tasks
from horizonrl.config import load_config
from horizonrl.engines.scripted import ScriptedEngine
from horizonrl.gateway import Gateway, GatewayThread, Recorder
from horizonrl.report.metrics import read_metrics
from horizonrl.tasks import arithmetic
from horizonrl.tools.registry import import_target
from horizonrl.train.loop import train

from integration.agent_frameworks.teacher import exact_teacher

RECIPE = Path(__file__).resolve().parents[2] / "configs" / "arithmetic_openai_agent.yaml"
PACKAGE = "integration.agent_frameworks"
OPENAI_AGENTS, LANGGRAPH = ("agents",), ("langgraph.prebuilt", "langchain_openai")
# test id: (the modules the framework needs, the agent in agent_frameworks/)
AGENTS = {
    "openai-agents": (OPENAI_AGENTS, "openai_agents_agent:agent"),
    "openai-agents-responses": (OPENAI_AGENTS, "openai_agents_agent:responses_agent"),
    "openai-agents-structured": (OPENAI_AGENTS, "openai_agents_agent:structured_agent"),
    "openai-agents-responses-structured": (OPENAI_AGENTS, "openai_agents_agent:structured_responses_agent"),
    "langgraph": (LANGGRAPH, "langgraph_agent:agent"),
    "langgraph-structured": (LANGGRAPH, "langgraph_agent:structured_agent"),
    "smolagents": (("smolagents",), "smolagents_agent:agent"),
    "litellm": (("litellm",), "litellm_agent:agent"),
    "openai-agents-streamed": (OPENAI_AGENTS, "openai_agents_agent:streamed_agent"),
    "langgraph-streamed": (LANGGRAPH, "langgraph_agent:streamed_agent"),
    "smolagents-streamed": (("smolagents",), "smolagents_agent:streamed_agent"),
    "litellm-streamed": (("litellm",), "litellm_agent:streamed_agent"),
    "litellm-structured": (("litellm",), "litellm_agent:structured_agent"),
}
TASKS = [arithmetic.make_task(seed) for seed in range(len(AGENTS))]
SHOWN_CHARS = 2000   # of a printed request body (its messages or input and its tools summarised)


def framework_agent(name: str):
    """The agent `name` (skipped where its framework is not installed). Found, not imported, before the agent's
    module imports it: LiteLLM's agent sets its offline switches before its import."""
    modules, target = AGENTS[name]
    for module in modules:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    return import_target(f"{PACKAGE}.{target}")


@pytest.fixture(scope="module")
def gateway(qwen_tokenizer):
    """A gateway over the scripted teacher of TASKS, every request and answer logged: (gateway, base URL,
    the log: one dict per request, with its rollout id, path, status, request body and JSON answer)."""
    logged = []

    @web.middleware
    async def log_bodies(request: web.Request, handler) -> web.StreamResponse:
        raw = await request.read()      # aiohttp keeps the body: the handler reads it again
        response = await handler(request)
        rollout = re.match(r"/rollouts/([^/]+)/", request.path)     # from the path: a 404 matched no route
        entry = {"rollout": rollout and rollout[1], "path": request.path, "status": response.status}
        try:
            entry["request"] = json.loads(raw) if raw else None
        except ValueError:
            entry["request"] = raw.decode(errors="replace")
        if isinstance(response, web.Response) and response.body is not None:
            entry["response"] = json.loads(response.body)
        logged.append(entry)
        return response

    server = Gateway(ScriptedEngine(qwen_tokenizer, exact_teacher(TASKS)), qwen_tokenizer, "scripted", 32768,
                     (qwen_tokenizer.eos_token_id,), Recorder())
    server.app.middlewares.insert(0, log_bodies)     # outermost: it sees the answer the client gets, errors too
    thread = GatewayThread(server)
    url = thread.start()
    yield server, url, logged
    thread.stop()


def summary(body) -> str:
    """A request body with its messages (or Responses input) and tools summarised: the fields it sets."""
    if not isinstance(body, dict):
        return repr(body)[:SHOWN_CHARS]
    shown = dict(body)
    for key in ("messages", "input"):
        if isinstance(shown.get(key), list):
            shown[key] = [item.get("role") or item.get("type") for item in shown[key]]
    if isinstance(shown.get("tools"), list):
        shown["tools"] = [tool.get("name") or tool.get("function", {}).get("name") for tool in shown["tools"]]
    return json.dumps(shown)[:SHOWN_CHARS]


@pytest.mark.parametrize("name", list(AGENTS))
def test_a_framework_agent_calls_its_tool_through_the_gateway(gateway, qwen_tokenizer, name):
    agent = framework_agent(name)
    server, url, logged = gateway
    task = TASKS[list(AGENTS).index(name)]
    before = dict(server.stats)
    try:
        reward, raised = asyncio.run(agent(asdict(task), f"{url}/rollouts/{name}/v1")), None
    except Exception as error:     # reported below, after the refused request that usually caused it
        reward, raised = None, error
    sent = [entry for entry in logged if entry["rollout"] == name]
    print(f"{name}: {len(sent)} requests")
    for entry in sent:
        print(f"  {entry['status']} POST {entry['path']} {summary(entry['request'])}")
    refused = [entry for entry in sent if entry["status"] != 200]
    assert not refused, (f"the gateway refused {name}'s request {refused[0]['path']}:\nrequest: "
                         f"{json.dumps(refused[0]['request'])}\nanswer: {json.dumps(refused[0].get('response'))}")
    assert raised is None, f"{name}'s agent raised {type(raised).__name__}: {raised}"
    assert {key: server.stats[key] - before[key] for key in ("errors", "server_errors", "tool_call_parse_failures")} \
        == {"errors": 0, "server_errors": 0, "tool_call_parse_failures": 0}
    calls = server.recorder.take(name).calls
    assert len(calls) >= 2 and reward == 1.0, (len(calls), reward)
    assert all(entry["request"].get("stream", False) for entry in sent) == name.endswith("-streamed")
    # the first call made the calculator call, the second one's prompt has its result
    first, second = (qwen_tokenizer.decode(call.prompt_ids) for call in calls[:2])
    result = str(task.data["answer"])
    assert result not in first and result in second


# Training: the recipe's tiny run made small. Its tokenizer's corpus is 32 teacher conversations (256 in a real
# run; 32 keep each run to seconds); the warm start is as long as the tiny model needs to make the calculator
# call, so that the tool round trip is trained too.
TRAIN = ["iterations=2", "group.n_tasks=2", "group.group_size=2", "rollout.max_tokens=48", "device=cpu",
         "model.warm_start.iterations=2", "model.warm_start.steps=100", "model.warm_start.lr=3.0e-3",
         f"task.teacher={PACKAGE}.teacher:teacher"]
# A forced tool call (smolagents' tool_choice="required") and a JSON response format are constrained decoding,
# which a run trains on only with truncated importance sampling (actor.tis_cap). smolagents' prompts are ~1,000
# tokens of the tiny model (its system prompt), LangGraph's structured ones ~250 (the tokenizer's corpus is each
# conversation's last call, which there has neither the system prompt nor the tools), the others' ~70: their warm
# starts are shorter (a forced tool call needs no format learnt), as one like the others' takes ~140 s and ~80 s.
CONSTRAINED = ["actor.tis_cap=2"]
SHORT_WARM_START = ["model.warm_start.iterations=1", "model.warm_start.steps=30"]
# One run per framework (CI's time): openai-agents' default agent (the Responses API), LangGraph's with a response
# format (its tool calls and a constrained JSON answer), smolagents' default agent (every call a forced tool call)
# and LiteLLM's.
TRAINED = {"openai-agents-responses": [], "langgraph-structured": CONSTRAINED + SHORT_WARM_START,
           "smolagents": CONSTRAINED + SHORT_WARM_START, "litellm": []}


@pytest.mark.parametrize("name,overrides", TRAINED.items(), ids=list(TRAINED))
def test_a_framework_agent_trains_two_iterations(tmp_path, monkeypatch, caplog, name, overrides):
    framework_agent(name)
    monkeypatch.setattr(train_tasks, "CORPUS_TASKS", 32)
    cfg = load_config(RECIPE, [*TRAIN, *overrides, f"task.agent={PACKAGE}.{AGENTS[name][1]}", f"output_dir={tmp_path}"])
    with caplog.at_level(logging.WARNING, logger="horizonrl"):
        try:
            run_dir, raised = train(cfg, progress=False), None
        except Exception as error:
            run_dir, raised = None, error
    dropped = [record.getMessage() for record in caplog.records if "dropped from" in record.getMessage()]
    assert raised is None, f"training raised {type(raised).__name__}: {raised}\nagents dropped: {dropped[:2]}"
    records = read_metrics(run_dir / "metrics.jsonl")
    print(name, [{key: record[key] for key in ("iteration", "env/errors", "env/episodes", "env/turns",
                                               "rollout/prompt_length", "rollout/tool_call_parse_failures")}
                 for record in records])
    assert [record["iteration"] for record in records] == [1, 2]
    assert all(record["env/errors"] == 0 and record["env/episodes"] == 4 for record in records), dropped[:2]
    assert sum(record["env/turns"] for record in records) > 8     # some rollout made the calculator call
