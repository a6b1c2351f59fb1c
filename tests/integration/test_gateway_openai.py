"""`horizonrl gateway` through the real openai client: chat, completions, streaming, tools, n, log-probs,
seeds, greedy decoding, and the traces and rollouts it records. Expected prompts come from the tokenizer's
own chat template, greedy tokens from the model's own forward passes."""

import asyncio
import json

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from integration.gateway_process import gateway_process
from integration.test_constrained_decoding import is_json

from horizonrl.engines.hf import HFEngine
from horizonrl.engines.scripted import ScriptedEngine
from horizonrl.gateway import Gateway, GatewayThread
from horizonrl.learner.models import load_policy, resolve_model_path, stop_ids

MODEL = "builtin:babyai-tiny"
MESSAGES = [{"role": "system", "content": "You play BabyAI."}, {"role": "user", "content": "go to the red ball"}]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}]
TOOL_TEXT = 'I will add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model_path(MODEL))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`horizonrl gateway builtin:babyai-tiny` in a subprocess: its base URL and traces file."""
    traces = tmp_path_factory.mktemp("gateway") / "traces.jsonl"
    with gateway_process(MODEL, "--traces", str(traces)) as (url, process):
        assert process.stdout.readline().startswith(f"gateway: {url}/v1")   # bound to 127.0.0.1 by default
        yield url, traces


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key="unused")


def template_ids(tokenizer, messages, tools=None):
    return list(tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True,
                                              return_dict=True)["input_ids"])


def trace_lines(traces):
    return [json.loads(line) for line in traces.read_text().splitlines()]


def test_models(client):
    assert [model.id for model in client.models.list()] == [MODEL]


def test_chat_returns_exact_ids_and_records_them(client, server, tokenizer):
    response = client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=16)
    (choice,) = response.choices
    assert response.model == MODEL and response.object == "chat.completion"
    assert response.prompt_token_ids == template_ids(tokenizer, MESSAGES)
    assert choice.message.role == "assistant"
    assert choice.message.content == tokenizer.decode(choice.token_ids, skip_special_tokens=True)
    assert response.usage.prompt_tokens == len(response.prompt_token_ids)
    assert response.usage.completion_tokens == len(choice.token_ids)
    (call,) = [line for line in trace_lines(server[1]) if line.get("response_ids") == choice.token_ids]
    assert call["event"] == "call" and call["rollout_id"] is None and call["messages"] == MESSAGES
    assert call["prompt_ids"] == template_ids(tokenizer, MESSAGES)
    assert tokenizer.decode(call["response_ids"], skip_special_tokens=True) == choice.message.content
    assert call["response"] == {"role": "assistant", "content": choice.message.content}
    assert len(call["response_logprobs"]) == len(call["response_ids"]) and call["started"] <= call["finished"]


def test_chat_stream_through_the_async_client(server, tokenizer):
    async def stream():
        async with openai.AsyncOpenAI(base_url=f"{server[0]}/v1", api_key="unused") as client:
            chunks = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16, stream=True,
                                                          stream_options={"include_usage": True})
            return [chunk async for chunk in chunks]

    chunks = asyncio.run(stream())
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0].prompt_token_ids == template_ids(tokenizer, MESSAGES)
    assert chunks[0].choices[0].delta.role == "assistant"
    *choice_chunks, usage = chunks
    assert usage.choices == [] and usage.usage.prompt_tokens == len(chunks[0].prompt_token_ids)
    content = "".join(chunk.choices[0].delta.content or "" for chunk in choice_chunks)
    token_ids = choice_chunks[-1].choices[0].token_ids
    assert choice_chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert content == tokenizer.decode(token_ids, skip_special_tokens=True)
    assert usage.usage.completion_tokens == len(token_ids)


def test_completions_plain_and_streamed(client, tokenizer):
    response = client.completions.create(model=MODEL, prompt="go to the red ball", max_tokens=8, logprobs=0)
    (choice,) = response.choices
    assert response.prompt_token_ids == tokenizer.encode("go to the red ball", add_special_tokens=False)
    assert choice.text == tokenizer.decode(choice.token_ids, skip_special_tokens=True)
    assert len(choice.logprobs.token_logprobs) == len(choice.token_ids)
    by_ids = client.completions.create(model=MODEL, prompt=response.prompt_token_ids, max_tokens=8, seed=3)
    assert by_ids.prompt_token_ids == response.prompt_token_ids
    chunks = list(client.completions.create(model=MODEL, prompt="go to the red ball", max_tokens=8, stream=True,
                                            seed=3))
    assert chunks[-1].choices[0].token_ids == by_ids.choices[0].token_ids
    assert "".join(chunk.choices[0].text for chunk in chunks) == by_ids.choices[0].text
    two = list(client.completions.create(model=MODEL, prompt="go to the red ball", max_tokens=8, stream=True, n=2,
                                         seed=3))
    finished = {chunk.choices[0].index: chunk.choices[0].token_ids for chunk in two if chunk.choices[0].finish_reason}
    assert finished[0] == by_ids.choices[0].token_ids and set(finished) == {0, 1}


def test_tools_are_rendered_into_the_prompt(client, tokenizer):
    response = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, max_tokens=8)
    assert response.prompt_token_ids == template_ids(tokenizer, MESSAGES, TOOLS)
    assert response.prompt_token_ids != template_ids(tokenizer, MESSAGES)


def test_n_choices_logprobs_and_seeds(client):
    response = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16, n=2, logprobs=True,
                                              seed=11)
    assert [choice.index for choice in response.choices] == [0, 1]
    assert response.usage.completion_tokens == sum(len(choice.token_ids) for choice in response.choices)
    for choice in response.choices:
        assert len(choice.logprobs.content) == len(choice.token_ids)
        assert all(entry.logprob <= 0 for entry in choice.logprobs.content)
    again = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16, n=2, seed=11)
    assert [c.token_ids for c in again.choices] == [c.token_ids for c in response.choices]
    shifted = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16, seed=12)
    assert shifted.choices[0].token_ids == response.choices[1].token_ids   # choice i samples with seed + i


def test_temperature_zero_is_greedy(client, tokenizer):
    """On a prompt the model is unsure about (its first sampled token has p < 0.5), every choice is the argmax."""
    response = client.completions.create(model=MODEL, prompt="a", max_tokens=8, temperature=0, n=3)
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(MODEL), dtype=torch.float32).eval()
    ids = list(response.prompt_token_ids)
    with torch.no_grad():
        assert model(torch.tensor([ids])).logits[0, -1].softmax(-1).max() < 0.5
        while len(ids) - len(response.prompt_token_ids) < 8 and ids[-1] != tokenizer.eos_token_id:
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert [choice.token_ids for choice in response.choices] == [ids[len(response.prompt_token_ids):]] * 3


def test_a_rollout_url_records_under_its_id_and_takes_rewards(server, tokenizer):
    url, traces = server
    rollout = openai.OpenAI(base_url=f"{url}/rollouts/episode-7/v1", api_key="unused")
    first = rollout.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8)
    follow_up = [*MESSAGES, first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "user", "content": "now pick it up"}]
    second = rollout.chat.completions.create(model=MODEL, messages=follow_up, max_tokens=8, n=2)
    posted = httpx.post(f"{url}/rollouts/episode-7/reward", json={"reward": 1.0, "call_rewards": {"2": 0.5}})
    assert posted.status_code == 200, posted.text
    lines = [line for line in trace_lines(traces) if line["rollout_id"] == "episode-7"]
    calls = [line for line in lines if line["event"] == "call"]
    assert [call["index"] for call in calls] == [0, 1, 2]
    assert [call["response_ids"] for call in calls] == [c.token_ids for c in first.choices + second.choices]
    assert calls[1]["prompt_ids"] == template_ids(tokenizer, follow_up) == second.prompt_token_ids
    assert lines[-1] == {"event": "reward", "rollout_id": "episode-7", "reward": 1.0, "agent": None,
                         "call_rewards": {"2": 0.5}}
    assert httpx.post(f"{url}/rollouts/episode-7/reward", json={"call_rewards": {"3": 1}}).status_code == 400


@pytest.fixture(scope="module")
def tool_gateway(tokenizer):
    """An in-process gateway over a test double of the model that answers with `TOOL_TEXT`, or a malformed
    call when the last message asks for one."""
    def respond(prompt: str) -> str:
        return "<tool_call>\n{broken\n</tool_call>" if "malformed" in prompt else TOOL_TEXT

    gateway = Gateway(ScriptedEngine(tokenizer, respond), tokenizer, "scripted", 2048, (tokenizer.eos_token_id,))
    thread = GatewayThread(gateway)
    url = thread.start()
    yield gateway, openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    thread.stop()


def test_tool_calls_come_back_parsed(tool_gateway):
    _, client = tool_gateway
    response = client.chat.completions.create(model="any", messages=MESSAGES, tools=TOOLS)
    (choice,) = response.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content == "I will add."
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.function.name == "add"
    assert json.loads(call.function.arguments) == {"a": 1, "b": 2}
    plain = client.chat.completions.create(model="any", messages=MESSAGES, tools=TOOLS, tool_choice="none")
    assert plain.choices[0].message.content == TOOL_TEXT and plain.choices[0].message.tool_calls is None


def test_streamed_tool_calls(tool_gateway):
    _, client = tool_gateway
    chunks = list(client.chat.completions.create(model="any", messages=MESSAGES, tools=TOOLS, stream=True))
    deltas = [call for chunk in chunks for call in chunk.choices[0].delta.tool_calls or []]
    assert [(d.index, d.function.name, json.loads(d.function.arguments)) for d in deltas] == [(0, "add", {"a": 1,
                                                                                                          "b": 2})]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_malformed_tool_call_comes_back_as_content_and_is_counted(tool_gateway):
    gateway, client = tool_gateway
    before = gateway.stats["tool_call_parse_failures"]
    messages = [{"role": "user", "content": "malformed please"}]
    gateway.recorder.issue("malformed")
    rollout = openai.OpenAI(base_url=f"{client.base_url}".replace("/v1", "/rollouts/malformed/v1"), api_key="-")
    response = rollout.chat.completions.create(model="any", messages=messages, tools=TOOLS)
    assert response.choices[0].message.content == "<tool_call>\n{broken\n</tool_call>"
    assert response.choices[0].message.tool_calls is None and response.choices[0].finish_reason == "stop"
    assert gateway.stats["tool_call_parse_failures"] == before + 1
    (call,) = gateway.recorder.take("malformed").calls
    assert call.tool_call_parse_failed   # and so the turn's, counted in rollout/tool_call_parse_failures


RESPONSES_TOOLS = [{"type": "function", **TOOLS[0]["function"]}]


def rollout_client(client, rollout_id, **options):
    return openai.OpenAI(base_url=f"{client.base_url}".replace("/v1", f"/rollouts/{rollout_id}/v1"), api_key="-",
                         **options)


def test_the_responses_api_round_trip_records_rows_that_extend(tool_gateway, tokenizer):
    """openai's `responses.create`: a function call out, its output back under previous_response_id; the
    second call's prompt is the chat template's rendering of the whole conversation, and it extends the
    first call's prompt + response, so the rollout trains as one merged row."""
    gateway, client = tool_gateway
    gateway.recorder.issue("responses")
    rollout = rollout_client(client, "responses")
    first = rollout.responses.create(model="any", instructions="You add.", input="add 1 and 2", tools=RESPONSES_TOOLS)
    message, call = first.output
    assert first.status == "completed" and message.content[0].text == "I will add."
    assert call.type == "function_call" and call.name == "add" and json.loads(call.arguments) == {"a": 1, "b": 2}
    second = rollout.responses.create(model="any", instructions="You add.", previous_response_id=first.id,
                                      tools=RESPONSES_TOOLS,
                                      input=[{"type": "function_call_output", "call_id": call.call_id, "output": "3"}])
    assert second.usage.input_tokens == len(second.model_extra["prompt_token_ids"])
    a, b = gateway.recorder.take("responses").calls
    assert b.prompt_ids[:len(a.prompt_ids) + len(a.response_ids)] == a.prompt_ids + a.response_ids
    conversation = [{"role": "system", "content": "You add."}, {"role": "user", "content": "add 1 and 2"},
                    {"role": "assistant", "content": "I will add.", "tool_calls": [
                        {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
                    {"role": "tool", "content": "3"}]
    assert b.prompt_ids == template_ids(tokenizer, conversation, TOOLS)
    assert a.response_ids == first.model_extra["token_ids"] and a.messages[0] == conversation[0]


def test_the_responses_api_streamed(tool_gateway):
    _, client = tool_gateway
    events = list(client.responses.create(model="any", input="add", tools=RESPONSES_TOOLS, stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [e.delta for e in events if e.type == "response.output_text.delta"] == ["I will add."]
    (arguments,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(arguments.arguments) == {"a": 1, "b": 2}
    assert [item.type for item in events[-1].response.output] == ["message", "function_call"]


def test_unknown_routes_list_the_served_ones_and_max_tokens_is_capped_when_training(tokenizer):
    gateway = Gateway(ScriptedEngine(tokenizer, lambda prompt: "ok"), tokenizer, "scripted", 2048,
                      (tokenizer.eos_token_id,), max_tokens_limit=8, cap_max_tokens=True)
    thread = GatewayThread(gateway)
    url = thread.start()
    try:
        missing = httpx.post(f"{url}/v1/assistants", json={})
        assert missing.status_code == 404
        assert "POST /v1/responses" in missing.json()["error"]["message"]
        assert "POST /rollouts/{rollout_id}/v1/chat/completions" in missing.json()["error"]["message"]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="-")
        for _ in range(2):
            client.chat.completions.create(model="any", messages=MESSAGES, max_tokens=256)
        assert gateway.stats["max_tokens_capped"] == 2 and gateway.stats["errors"] == 1
    finally:
        thread.stop()


ANSWER_SCHEMA = {"type": "object", "properties": {"action": {"enum": ["turn left", "turn right", "go forward"]},
                                                  "done": {"type": "boolean"}},
                 "required": ["action", "done"], "additionalProperties": False}


@pytest.fixture(scope="module")
def model_gateway(tokenizer):
    """An in-process gateway over the tiny BabyAI policy sampled by the hf engine."""
    tokenizer, model = load_policy(MODEL, torch.device("cpu"))
    gateway = Gateway(HFEngine(model, tokenizer.pad_token_id, tokenizer=tokenizer), tokenizer, MODEL, 2048,
                      stop_ids(tokenizer, model))
    thread = GatewayThread(gateway)
    url = thread.start()
    yield openai.OpenAI(base_url=f"{url}/v1", api_key="-")
    thread.stop()


def test_structured_output_is_always_valid_json_of_the_schema(model_gateway):
    """64 sampled answers of the tiny policy under a json_schema response format all parse and match the schema
    (an enum and a boolean: checked by hand); unconstrained, none of 64 is JSON at all."""
    response_format = {"type": "json_schema", "json_schema": {"name": "step", "schema": ANSWER_SCHEMA, "strict": True}}
    constrained = [choice.message.content for _ in range(8) for choice in model_gateway.chat.completions.create(
        model="any", messages=MESSAGES, n=8, max_tokens=64, response_format=response_format).choices]
    answers = [json.loads(text) for text in constrained]
    assert len(answers) == 64 and all(set(a) == {"action", "done"} and a["action"] in ANSWER_SCHEMA["properties"][
        "action"]["enum"] and isinstance(a["done"], bool) for a in answers)
    # as json.dumps writes it
    assert all(text == json.dumps(answer) for text, answer in zip(constrained, answers, strict=True))
    free = [choice.message.content for _ in range(8) for choice in model_gateway.chat.completions.create(
        model="any", messages=MESSAGES, n=8, max_tokens=64).choices]
    assert sum(is_json(text) for text in free) == 0
    text_format = {"format": {"type": "json_schema", "name": "step", "schema": ANSWER_SCHEMA, "strict": True}}
    assert set(json.loads(model_gateway.responses.create(model="any", input="go", text=text_format).output_text)) == {
        "action", "done"}


def test_a_forced_tool_call_always_comes_back_as_a_call(model_gateway):
    """tool_choice "required" or named: every one of 16 sampled answers of the tiny policy is one call whose
    arguments match its tool's parameters (enums and booleans: with a number, a tiny model writes digits until
    max_tokens runs out)."""
    look = {"type": "object", "properties": {"far": {"type": "boolean"}}, "required": ["far"]}
    tools = [{"type": "function", "function": {"name": "step", "parameters": ANSWER_SCHEMA}},
             {"type": "function", "function": {"name": "look", "parameters": look}}]
    named = {"type": "function", "function": {"name": "look"}}
    calls = []
    for tool_choice in ("required", named):
        response = model_gateway.chat.completions.create(model="any", messages=MESSAGES, tools=tools, n=8,
                                                         max_tokens=160, tool_choice=tool_choice)
        assert {choice.finish_reason for choice in response.choices} == {"tool_calls"}
        calls += [(tool_choice, *choice.message.tool_calls) for choice in response.choices]
    for tool_choice, call in calls:
        arguments = json.loads(call.function.arguments)
        assert set(arguments) == ({"far"} if call.function.name == "look" else {"action", "done"})
        assert call.function.name == "look" or tool_choice == "required"

