"""agent.history=full, in both feedback modes (new round, continuation): every prompt extends the
previous prompt + response ids exactly, so the turns of an episode merge into one row with no split, on
our BPE tokenizer and on the exact Qwen2.5 tokenizer, with the real collector."""

import pytest

from horizonrl.agents.agent import Agent, new_round_ids
from horizonrl.agents.prompt import HistoryEntry, user_message
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.scripted import RandomFormatEngine
from horizonrl.envs.pool import open_envs
from horizonrl.rollout.fixed_turn import FixedTurnCollector
from horizonrl.samples.merge import merge_turns


def collect_full_history(tokenizer, feedback, e_len=6):
    handles = open_envs("river", {"stones": 3, "max_steps": 8}, 3, workers=False, timeout_s=10)
    engine = RandomFormatEngine(tokenizer, handles[0].actions, seed=0)
    agent = Agent(tokenizer, history="full", feedback=feedback)
    collector = FixedTurnCollector(handles, agent, engine, SamplingParams(stop_patterns=agent.stop_patterns),
                                   e_len, seed=2)
    return collector.collect() + collector.collect()


@pytest.mark.parametrize("feedback", ["new_round", "continuation"])
@pytest.mark.parametrize("which", ["river_tiny", "qwen_tokenizer"])
def test_full_history_episodes_merge_without_splits(which, feedback, request):
    fixture = request.getfixturevalue(which)
    tokenizer = fixture[0] if which == "river_tiny" else fixture
    episodes = collect_full_history(tokenizer, feedback)
    samples, report = merge_turns(episodes, tokenizer=tokenizer)
    turns = sum(len(e.turns) for e in episodes)
    assert report.turns == turns and report.rows == len(episodes) and report.merged == turns - len(episodes)
    assert report.as_metrics()["data/merge/split_other"] == report.as_metrics()["data/merge/split_template"] == 0
    for episode, row in zip(episodes, samples.input_ids):
        last = episode.turns[-1]
        assert row == last.prompt_ids + last.response_ids
        for before, after in zip(episode.turns, episode.turns[1:]):
            assert after.prompt_ids[: len(before.prompt_ids) + len(before.response_ids)] == (
                before.prompt_ids + before.response_ids)


def test_new_round_ids_are_what_the_template_writes(qwen_tokenizer):
    tok = qwen_tokenizer
    ids = new_round_ids(tok, [{"role": "user", "content": "Current Observation:\nhi"}])
    assert tok.decode(ids) == "\n<|im_start|>user\nCurrent Observation:\nhi<|im_end|>\n<|im_start|>assistant\n"
    cut = new_round_ids(tok, [{"role": "user", "content": "x"}], closed=False)
    assert cut[0] == tok.eos_token_id      # a cut response gets its EOS
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    first = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    response = tok.encode("THINK: ok\nACTION: wait", add_special_tokens=False) + [tok.eos_token_id]
    full = tok.apply_chat_template(messages + [{"role": "assistant", "content": "THINK: ok\nACTION: wait"},
                                               {"role": "user", "content": "v"}],
                                   add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert list(first) + response + new_round_ids(tok, [{"role": "user", "content": "v"}]) == list(full)


def test_continuation_appends_the_observation_inside_the_assistant_message(qwen_tokenizer):
    tok = qwen_tokenizer
    episodes = collect_full_history(tok, "continuation")
    turns = [t for e in episodes for t in e.turns]
    assert all(t.valid_action and tok.eos_token_id not in t.response_ids for t in turns)
    first, second = next(e.turns[:2] for e in episodes if len(e.turns) >= 2)
    appended = tok.decode(second.prompt_ids[len(first.prompt_ids) + len(first.response_ids):])
    response = tok.decode(first.response_ids)
    assert response.startswith("THINK: ") and response.endswith(f"ACTION: {first.action}\n")
    assert appended.startswith("\nCurrent Observation:\n") and appended.endswith("\n\n")
    assert "<|im_end|>" not in tok.decode(second.prompt_ids[len(first.prompt_ids):])   # one assistant message
    assert tok.decode(first.prompt_ids).endswith("<|im_start|>assistant\n")


def test_continuation_after_a_closed_response_starts_a_new_round(qwen_tokenizer):
    tok = qwen_tokenizer
    agent = Agent(tok, history="full", feedback="continuation")
    prompt = [1, 2, 3]
    closed = tok.encode("THINK: x\nACTION: wait", add_special_tokens=False) + [tok.eos_token_id]
    cut = tok.encode("THINK: x\nACTION: wa", add_special_tokens=False)         # max_tokens hit mid-line
    entry = lambda response: [HistoryEntry("o", "p", tuple(prompt), tuple(response))]   # noqa: E731
    assert agent.prompt_ids(None, entry(closed), "obs") == prompt + closed + new_round_ids(
        tok, [{"role": "user", "content": user_message("obs")}])
    assert tok.decode(agent.prompt_ids(None, entry(cut), "obs")[len(prompt) + len(cut):]) == (
        "\n\nCurrent Observation:\nobs\n\n")
    with pytest.raises(ValueError, match="history=full"):
        Agent(tok, feedback="continuation")
