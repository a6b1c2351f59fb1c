"""The gateway's recorder: which rollout ids it accepts, calls in order until taken, rewards, trace lines."""

import json

import pytest

from horizonrl.gateway import Call, Recorder, Rollout


def call(rollout_id, index, response_ids=(5,)):
    return Call(rollout_id, index, [{"role": "user", "content": "hi"}], None, [1, 2], list(response_ids), [-0.5],
                "stop", {"role": "assistant", "content": "ok"}, 0, 10.0, 11.0)


def test_issued_only_accepts_issued_ids_until_taken():
    recorder = Recorder(issued_only=True)
    assert not recorder.accepts("a")
    recorder.issue("a")
    assert recorder.accepts("a") and not recorder.accepts("b")
    assert recorder.take("a") == Rollout("a")   # no call made: an empty rollout
    assert not recorder.accepts("a")
    open_recorder = Recorder()
    assert open_recorder.accepts("anything")
    open_recorder.take("anything")
    assert not open_recorder.accepts("anything")


def test_calls_rewards_and_trace_lines(tmp_path):
    traces = tmp_path / "traces.jsonl"
    recorder = Recorder(traces)
    assert recorder.next_index("a") == 0 and recorder.next_index(None) == 0
    recorder.record(call("a", 0))
    recorder.record(call(None, 0))
    recorder.record(call("a", 1, (6, 7)))
    assert recorder.next_index("a") == 2 and recorder.next_index(None) == 1
    recorder.set_reward("a", 1.0, {1: 0.25})
    with pytest.raises(KeyError, match=r"no call at index \[2\]"):
        recorder.set_reward("a", call_rewards={2: 1.0})
    rollout = recorder.take("a")
    assert rollout.reward == 1.0 and [(c.index, c.response_ids, c.reward) for c in rollout.calls] == [
        (0, [5], None), (1, [6, 7], 0.25)]
    recorder.record(call("a", 0))   # after take: in the trace only
    assert recorder.take("a") == Rollout("a")
    recorder.close()
    lines = [json.loads(line) for line in traces.read_text().splitlines()]
    assert [(line["event"], line["rollout_id"]) for line in lines] == [
        ("call", "a"), ("call", None), ("call", "a"), ("reward", "a"), ("call", "a")]
    assert lines[2] == {"event": "call", "rollout_id": "a", "index": 1, "messages": [{"role": "user", "content": "hi"}],
                        "tools": None, "prompt_ids": [1, 2], "response_ids": [6, 7], "response_logprobs": [-0.5],
                        "finish_reason": "stop", "response": {"role": "assistant", "content": "ok"},
                        "weights_version": 0, "started": 10.0, "finished": 11.0, "tool_call_parse_failed": False,
                        "reward": None, "agent": None}
    assert lines[3] == {"event": "reward", "rollout_id": "a", "reward": 1.0, "agent": None,
                        "call_rewards": {"1": 0.25}}
