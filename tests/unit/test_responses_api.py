"""The Responses API as the chat request it amounts to, and its output items, response and events; expected
values written by hand from the OpenAI API reference."""

import json

import pytest

from horizonrl.gateway.openai_api import RequestError
from horizonrl.gateway.responses_api import (ResponseStore, chat_request, input_messages, output_items,
                                             parse_responses_request, response_events, response_object)

ADD = {"type": "function", "name": "add", "description": "Add", "strict": True,
       "parameters": {"type": "object", "properties": {"a": {"type": "number"}}, "required": ["a"]}}


def request(**fields):
    return parse_responses_request(json.dumps({"input": "hi", **fields}).encode())


def test_input_items_become_chat_messages():
    items = [{"role": "user", "content": [{"type": "input_text", "text": "add 1"},
                                          {"type": "input_text", "text": "+2"}]},
             {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
              "content": [{"type": "output_text", "text": "Adding.", "annotations": [], "logprobs": []}]},
             {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "add", "arguments": '{"a": 1}'},
             {"type": "function_call", "call_id": "c2", "name": "add", "arguments": '{"a": 2}'},
             {"type": "function_call_output", "call_id": "c1", "output": "1"},
             {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "2"}]},
             {"type": "function_call", "call_id": "c3", "name": "add", "arguments": "{}"}]
    assert input_messages(request(input=items)) == [
        {"role": "user", "content": "add 1\n+2"},
        {"role": "assistant", "content": "Adding.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}},
            {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
        {"role": "tool", "tool_call_id": "c2", "content": "2"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c3", "type": "function", "function": {"name": "add", "arguments": "{}"}}]}]
    assert input_messages(request()) == [{"role": "user", "content": "hi"}]
    for item, param in [({"type": "reasoning", "summary": []}, "input.0.type"),
                        ({"type": "function_call", "name": "add"}, "input.0.call_id"),
                        ({"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}, "input.0.content")]:
        with pytest.raises(RequestError) as error:
            input_messages(request(input=[item]))
        assert error.value.param.startswith(param), (item, error.value.param)


def test_the_chat_request_it_amounts_to():
    body = request(instructions="Be brief.", tools=[ADD], tool_choice={"type": "function", "name": "add"},
                   parallel_tool_calls=False, max_output_tokens=12, temperature=0.5, top_p=0.9,
                   include=["message.output_text.logprobs"], metadata={"k": "v"}, user="u", reasoning={"effort": "low"},
                   text={"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True},
                         "verbosity": "low"}, truncation="disabled", store=False)
    chat = chat_request(body, [{"role": "user", "content": "hi"}])
    assert [m.role for m in chat.messages] == ["system", "user"] and chat.messages[0].content == "Be brief."
    assert chat.tools == [{"type": "function", "function": {"name": "add", "description": "Add",
                                                            "parameters": ADD["parameters"]}}]
    assert chat.tool_choice.function.name == "add" and chat.parallel_tool_calls is False
    assert (chat.max_tokens, chat.temperature, chat.top_p, chat.logprobs) == (12, 0.5, 0.9, True)
    assert chat.response_format.type == "json_schema" and chat.response_format.json_schema.json_schema == {
        "type": "object"}
    assert chat_request(request(), [{"role": "user", "content": "hi"}]).messages[0].role == "user"   # no system
    for fields, param in [({"service_tier": "auto"}, "service_tier"), ({"top_logprobs": 3}, "top_logprobs"),
                          ({"truncation": "auto"}, "truncation"), ({"tools": [{"type": "web_search"}]}, "tools.0"),
                          ({"tool_choice": "required"}, "tool_choice")]:
        with pytest.raises(RequestError) as error:
            chat_request(request(**fields), [{"role": "user", "content": "hi"}])
        assert error.value.param.startswith(param), (fields, error.value.param)
    with pytest.raises(RequestError, match="no input") as error:
        chat_request(request(input=[]), [])


def test_output_items_response_and_events():
    message = {"role": "assistant", "content": "Adding.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]}
    logprobs = {"content": [{"token": "A", "logprob": -0.5, "bytes": [65], "top_logprobs": []}]}
    text, call = output_items(message, logprobs)
    assert text["type"] == "message" and text["id"].startswith("msg_") and text["role"] == "assistant"
    assert text["content"] == [{"type": "output_text", "text": "Adding.", "annotations": [],
                                "logprobs": logprobs["content"]}]
    assert call == {"type": "function_call", "id": call["id"], "call_id": "call_1", "name": "add",
                    "arguments": '{"a": 1}', "status": "completed"} and call["id"].startswith("fc_")
    assert [item["type"] for item in output_items({**message, "content": None}, None)] == ["function_call"]
    assert output_items({"role": "assistant", "content": ""}, None)[0]["content"][0]["text"] == ""

    response = response_object(request(), "m", 5, [text, call], "tool_calls", [1, 2, 3], [4, 5])
    assert response["status"] == "completed" and response["incomplete_details"] is None
    assert response["usage"] == {"input_tokens": 3, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 2,
                                 "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 5}
    assert (response["prompt_token_ids"], response["token_ids"]) == ([1, 2, 3], [4, 5])
    cut = response_object(request(), "m", 5, [text], "length", [1], [2])
    assert cut["status"] == "incomplete" and cut["incomplete_details"] == {"reason": "max_output_tokens"}

    events = response_events(response)
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(13))
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    assert events[4]["delta"] == "Adding." and events[9]["delta"] == '{"a": 1}'
    assert events[-1]["response"] is response and response_events(cut)[-1]["type"] == "response.incomplete"


def conversation(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_the_store_keeps_the_last_conversations_of_no_rollout():
    store = ResponseStore(capacity=2)
    for k in range(3):
        store.keep(None, f"resp_{k}", conversation(str(k)))
    assert store.conversation("resp_2") == conversation("2") and store.conversation(None) == []
    with pytest.raises(RequestError, match="no stored response 'resp_0'.* the plain /v1 routes the last 2") as error:
        store.conversation("resp_0")
    assert (error.value.param, error.value.code, error.value.status) == (
        "previous_response_id", "previous_response_not_found", 400)


def test_a_rollouts_conversations_are_kept_until_it_is_collected():
    """Capacity 2, five rollouts live at once: the first one's response outlives the four stored after it and
    the three responses of no rollout (which evict each other); collected, a rollout's responses are gone."""
    store = ResponseStore(capacity=2)
    store.keep("r0", "resp_early", conversation("early"))
    for k in range(1, 5):
        store.keep(f"r{k}", f"resp_r{k}", conversation(str(k)))
    for k in range(3):
        store.keep(None, f"resp_plain{k}", conversation(str(k)))
    assert store.conversation("resp_early") == conversation("early")
    assert [store.conversation(f"resp_r{k}") for k in range(1, 5)] == [conversation(str(k)) for k in range(1, 5)]
    store.keep("r0", "resp_later", conversation("later"))
    store.forget("r0")
    for response_id in ("resp_early", "resp_later"):
        with pytest.raises(RequestError, match=f"no stored response '{response_id}': this gateway keeps a rollout's "
                                               "responses until the rollout is collected"):
            store.conversation(response_id)
    assert store.conversation("resp_r1") == conversation("1") and store.conversation("resp_plain2") == conversation("2")
    store.forget("never-stored")                 # a rollout that stored nothing is collected too
