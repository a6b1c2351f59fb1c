"""The gateway's OpenAI formats as pure functions: requests in, prompts and sampling parameters out,
Generations back as choices; expected values written by hand."""

import json

import pytest
from transformers import AutoTokenizer

from horizonrl.engines.base import Generation
from horizonrl.engines.grammar import call_or_json_grammar, json_grammar, tool_call_grammar
from horizonrl.gateway.openai_api import (RequestError, ServedModel, answer, assistant_message, choice_chunks,
                                          choice_params, cut_at_stop, logprobs_of, normalise_messages, parse_request,
                                          prompt_of)
from horizonrl.learner.models import resolve_model_path

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}]
TOOL_TEXT = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model_path("builtin:babyai-tiny"))


def chat(**fields):
    return parse_request(json.dumps({"messages": [{"role": "user", "content": "hi"}], **fields}).encode(), "chat")


def completion(**fields):
    return parse_request(json.dumps(fields).encode(), "completions")


def test_messages_are_normalised_for_the_chat_template():
    request = chat(messages=[
        {"role": "developer", "content": [{"type": "text", "text": "be brief"}, {"type": "text", "text": "and kind"}]},
        {"role": "user", "content": "add 1 and 2"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "3"}]},
    ])
    assert normalise_messages(request.messages) == [
        {"role": "system", "content": "be brief\nand kind"},
        {"role": "user", "content": "add 1 and 2"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
        {"role": "tool", "content": "3", "tool_call_id": "call_1"},
    ]


def test_tool_call_arguments_that_are_no_json_object_are_refused():
    request = chat(messages=[{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "add", "arguments": "[1, 2]"}}]}])
    with pytest.raises(RequestError, match="messages.0.tool_calls.0.function.arguments"):
        normalise_messages(request.messages)


def test_tool_calls_come_back_in_openai_format():
    message, failed = assistant_message(TOOL_TEXT, parse_tools=True)
    (call,) = message["tool_calls"]
    assert call["id"].startswith("call_") and len(call["id"]) == len("call_") + 24
    assert message == {"role": "assistant", "content": "Let me add.", "tool_calls": [
        {"id": call["id"], "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]}
    assert not failed
    only_call, _ = assistant_message(TOOL_TEXT.split("\n", 1)[1] + "\n<tool_call>{\"name\": \"f\"}</tool_call>", True)
    assert only_call["content"] is None
    assert [c["function"] for c in only_call["tool_calls"]] == [{"name": "add", "arguments": '{"a": 1, "b": 2}'},
                                                                {"name": "f", "arguments": "{}"}]


def test_a_malformed_block_or_no_tools_leaves_the_text_as_content():
    malformed = TOOL_TEXT + "\n<tool_call>\n{not json}\n</tool_call>"
    assert assistant_message(malformed, parse_tools=True) == ({"role": "assistant", "content": malformed}, True)
    assert assistant_message(TOOL_TEXT, parse_tools=False) == ({"role": "assistant", "content": TOOL_TEXT}, False)


def test_text_is_cut_before_the_earliest_stop_string():
    assert cut_at_stop("one. two! three", [".", "!"]) == "one"
    assert cut_at_stop("one. two! three", "!") == "one. two"
    assert cut_at_stop("one two", ["!"]) == "one two"
    assert cut_at_stop("one two", None) == "one two"


def test_the_answer_keeps_every_sampled_id_but_cuts_the_text(tokenizer):
    ids = tokenizer.encode("ACTION: turn leftACTION: turn right", add_special_tokens=False)
    assert ids == [355, 365]
    reply = answer(chat(stop=": turn r"), Generation(ids, [-0.5, -0.25], "stop"), tokenizer)
    assert reply.response == {"role": "assistant", "content": "ACTION: turn leftACTION"}
    assert reply.finish_reason == "stop"
    tool_reply = answer(chat(tools=[{"type": "function", "function": {"name": "add"}}]),
                        Generation(tokenizer.encode(TOOL_TEXT, add_special_tokens=False), None, "stop"), tokenizer)
    assert tool_reply.finish_reason == "tool_calls"


def test_logprobs_formats(tokenizer):
    generation = Generation([355, 365, 2], [-0.5, -0.25, -0.125], "stop")
    assert logprobs_of(chat(logprobs=True), generation, tokenizer) == {"content": [
        {"token": "ACTION: turn left", "logprob": -0.5, "bytes": list(b"ACTION: turn left"), "top_logprobs": []},
        {"token": "ACTION: turn right", "logprob": -0.25, "bytes": list(b"ACTION: turn right"), "top_logprobs": []},
        {"token": "<|im_end|>", "logprob": -0.125, "bytes": list(b"<|im_end|>"), "top_logprobs": []}]}
    completion = parse_request(b'{"prompt": "go", "logprobs": 0}', "completions")
    assert logprobs_of(completion, generation, tokenizer) == {
        "tokens": ["ACTION: turn left", "ACTION: turn right", "<|im_end|>"], "token_logprobs": [-0.5, -0.25, -0.125],
        "top_logprobs": None, "text_offset": [0, 17, 35]}
    assert logprobs_of(chat(), generation, tokenizer) is None
    assert logprobs_of(chat(logprobs=True), Generation([355], None, "stop"), tokenizer) is None


def test_streamed_chat_chunks_of_a_tool_call(tokenizer):
    ids = tokenizer.encode(TOOL_TEXT, add_special_tokens=False)
    request = chat(tools=[{"type": "function", "function": {"name": "add"}}])
    generation = Generation(ids, None, "stop")
    reply = answer(request, generation, tokenizer)
    role, body, end = choice_chunks(request, 3, reply, generation, tokenizer)
    assert role == {"index": 3, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    call = reply.response["tool_calls"][0]
    assert body["delta"] == {"content": "Let me add.", "tool_calls": [{"index": 0, **call}]}
    assert end == {"index": 3, "delta": {}, "logprobs": None, "finish_reason": "tool_calls", "token_ids": ids}


def test_fields_with_no_effect_are_accepted_unknown_ones_and_wrong_types_refused():
    no_effect = {"user": "me", "metadata": {"a": 1}, "store": True, "reasoning_effort": "low", "verbosity": "low"}
    assert chat(**no_effect, temperature=0).temperature == 0
    for unknown in ({"service_tier": "auto"}, {"functions": []}, {"modalities": ["text"]}):
        with pytest.raises(RequestError, match="is not supported by this server") as error:
            chat(**unknown)
        assert error.value.param == next(iter(unknown)) and error.value.code == "unsupported"
    defaults = chat(n=None, logprobs=None, stream=None, stop=None, max_tokens=None)   # null: the default
    assert (defaults.n, defaults.logprobs, defaults.stream, defaults.stop) == (1, False, False, None)
    for fields, param in [({"max_tokens": "many"}, "max_tokens"), ({"n": 0}, "n"), ({"temperature": -1}, "temperature"),
                          ({"messages": "hi"}, "messages"), ({"stop": [""]}, "stop"),
                          ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages.0.content"),
                          ({"tools": [{"type": "function", "function": {}}]}, "tools")]:
        with pytest.raises(RequestError) as error:
            chat(**fields)
        assert error.value.param.startswith(param), (fields, error.value.param)
    with pytest.raises(RequestError, match="not valid JSON"):
        parse_request(b'{"messages": [', "chat")


@pytest.mark.parametrize("fields", [{"top_logprobs": 2}, {"presence_penalty": 0.5}, {"frequency_penalty": 1},
                                    {"logit_bias": {"5": 1}}])
def test_options_we_cannot_honour_are_refused(fields):
    with pytest.raises(RequestError, match="not supported") as error:
        chat(**fields)
    assert error.value.param == next(iter(fields))


@pytest.mark.parametrize("fields, message", [
    ({"tool_choice": "required"}, "needs tools"),
    ({"tool_choice": {"type": "function", "function": {"name": "mul"}}, "tools": TOOLS}, "not among the tools"),
    ({"tool_choice": "any"}, "tool_choice"),
    ({"response_format": {"type": "json_schema"}}, "json_schema"),
    ({"response_format": {"type": "yaml"}}, "response_format")])
def test_tool_choice_and_response_format_are_checked(fields, message):
    with pytest.raises(RequestError, match=message):
        chat(**fields)


@pytest.mark.parametrize("fields", [{"echo": True}, {"logprobs": 2}, {"suffix": "x"}, {"best_of": 3},
                                    {"prompt": ["a", "b"]}, {"prompt": [[1], [2]]}])
def test_completion_options_we_cannot_honour_are_refused(fields):
    with pytest.raises(RequestError, match="not supported|one prompt per request"):
        parse_request(json.dumps({"prompt": "go", **fields}).encode(), "completions")


def test_completion_prompts_as_text_or_ids(tokenizer):
    model = ServedModel(tokenizer, "m", context_len=64, stop_ids=(2,))
    assert prompt_of(parse_request(b'{"prompt": "ACTION: turn left"}', "completions"), model) == ([355], None)
    assert prompt_of(parse_request(b'{"prompt": [7, 8]}', "completions"), model) == ([7, 8], None)
    for prompt in ("[1024]", "[]", '""'):
        with pytest.raises(RequestError, match="prompt"):
            prompt_of(parse_request(f'{{"prompt": {prompt}}}'.encode(), "completions"), model)


def test_sampling_parameters_and_limits(tokenizer):
    model = ServedModel(tokenizer, "m", context_len=100, stop_ids=(2,), max_tokens=50, max_n=4)
    first, second = choice_params(chat(n=2, seed=7, stop=["a.b", "!"], top_p=0.9), 80, model)
    assert (first.seed, second.seed) == (7, 8)
    assert first.max_tokens == 20 and first.temperature == 1.0 and first.top_p == 0.9 and first.stop_ids == (2,)
    assert first.stop_patterns == (r"a\.b", "!")
    assert choice_params(chat(), 10, model)[0].max_tokens == 50
    assert choice_params(chat(max_completion_tokens=5, temperature=0), 10, model)[0].max_tokens == 5
    assert [p.seed for p in choice_params(chat(n=2), 10, model)] == [None, None]
    for fields, prompt_len, message in [({}, 100, "context"), ({"max_tokens": 51}, 10, "limit of 50"),
                                        ({"max_tokens": 30}, 80, "exceed"), ({"n": 5}, 10, "limit of 4")]:
        with pytest.raises(RequestError, match=message):
            choice_params(chat(**fields), prompt_len, model)
    capping = ServedModel(tokenizer, "m", context_len=100, stop_ids=(2,), max_tokens=50, cap_max_tokens=True)
    assert choice_params(chat(max_tokens=256), 10, capping)[0].max_tokens == 50   # training: capped, not refused


def test_vllms_stop_token_ids_ignore_eos_and_64_bit_seeds_are_honoured(tokenizer):
    """What a client of vLLM's token-exact API sends (engines/openai_server.py): stop_token_ids end a response
    beside the model's stops, ignore_eos leaves only them; a seed near 2^63 wraps for the next choice."""
    model = ServedModel(tokenizer, "m", context_len=100, stop_ids=(2,))
    body = {"prompt": [7, 8], "return_token_ids": True, "logprobs": 0}
    assert choice_params(completion(**body), 10, model)[0].stop_ids == (2,)
    assert choice_params(completion(**body, stop_token_ids=[5, 6]), 10, model)[0].stop_ids == (5, 6, 2)
    assert choice_params(completion(**body, stop_token_ids=[5], ignore_eos=True), 10, model)[0].stop_ids == (5,)
    assert [p.seed for p in choice_params(completion(**body, seed=2**63 - 1, n=2), 10, model)] == [2**63 - 1, -2**63]
    with pytest.raises(RequestError, match="seed"):
        completion(**body, seed=2**63)


def test_constraints_and_one_call_at_most(tokenizer):
    """tool_choice and response_format become the grammar the engine samples under (engines/grammar.py);
    parallel_tool_calls false ends the response where the first call closes."""
    model = ServedModel(tokenizer, "m", context_len=100, stop_ids=(2,))
    named = {"type": "function", "function": {"name": "add"}}
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    json_schema = {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}
    expected = [({}, None), ({"tools": TOOLS}, None), ({"tools": TOOLS, "tool_choice": "none"}, None),
                ({"tools": TOOLS, "tool_choice": "required"}, tool_call_grammar(TOOLS)),
                ({"tools": TOOLS, "tool_choice": named}, tool_call_grammar(TOOLS, "add")),
                ({"response_format": {"type": "text"}}, None),
                ({"response_format": {"type": "json_object"}}, json_grammar(None)),
                ({"response_format": json_schema}, json_grammar(schema)),
                ({"response_format": json_schema, "tools": TOOLS}, call_or_json_grammar(TOOLS, schema)),
                ({"response_format": json_schema, "tools": TOOLS, "tool_choice": "none"}, json_grammar(schema))]
    for fields, grammar in expected:
        assert choice_params(chat(**fields), 10, model)[0].grammar == grammar, fields
    assert choice_params(chat(tools=TOOLS, parallel_tool_calls=False, stop="!"), 10, model)[0].stop_patterns == (
        "!", "</tool_call>")
    assert choice_params(chat(parallel_tool_calls=False), 10, model)[0].stop_patterns == ()   # no tools: no calls
    refusing = ServedModel(tokenizer, "m", context_len=100, stop_ids=(2,), constraint_refusal="set actor.tis_cap")
    assert choice_params(chat(tools=TOOLS), 10, refusing)[0].grammar is None
    for fields, param in [({"tools": TOOLS, "tool_choice": "required"}, "tool_choice"),
                          ({"response_format": {"type": "json_object"}}, "response_format")]:
        with pytest.raises(RequestError, match="set actor.tis_cap") as error:
            choice_params(chat(**fields), 10, refusing)
        assert error.value.param == param
