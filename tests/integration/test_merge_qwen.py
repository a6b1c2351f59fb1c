"""merge_turns on a real chat through the exact Qwen2.5 template and tokenizer (the session-scoped
`qwen_tokenizer` fixture takes seconds to load): a full-history chat merges into one row, per-turn and
merged rows give the same advantages, and planted prefix breaks are classified and written out."""

import dataclasses
import json

import torch

from horizonrl.config import PPOConfig
from horizonrl.records import Episode, Turn
from horizonrl.samples import Rows, TurnIndex, per_turn
from horizonrl.samples.merge import merge_turns, write_mismatches
from horizonrl.train.batch import PPOBatch
from horizonrl.train.ppo import estimate_advantages

IM_END = 151645


def turn(prompt, response, reward=0.0, terminated=False, truncated=False):
    return Turn(list(prompt), list(response), [-0.5] * len(response), reward, terminated, truncated)


# ---------------------------------------------------------------- a real chat through the Qwen template

def chat(tok, messages, add_generation_prompt=True):
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return tok.encode(text, add_special_tokens=False)


def encode(tok, text):
    return tok.encode(text, add_special_tokens=False)


def chat_episode(tok, episode_id, replies, observations, history=lambda reply: reply, rewards=None):
    """An agent that keeps the whole conversation: prompt_k = template(messages so far) + header;
    response_k = encode(reply) + <|im_end|>; `history` is how the agent writes the reply back."""
    messages = [{"role": "system", "content": "You are an agent in a grid world. Answer THINK: ... ACTION: ..."},
                {"role": "user", "content": observations[0]}]
    turns = []
    for k, reply in enumerate(replies):
        prompt = chat(tok, messages)
        response = reply if isinstance(reply, list) else encode(tok, reply) + [IM_END]
        text = reply if isinstance(reply, str) else tok.decode(reply).removesuffix("<|im_end|>")
        last = k == len(replies) - 1
        turns.append(turn(prompt, response, reward=(rewards or [0.0] * len(replies))[k], terminated=last))
        messages += [{"role": "assistant", "content": history(text)},
                     {"role": "user", "content": observations[(k + 1) % len(observations)]}]
    return Episode(episode_id, "chat", 0, turns=turns), messages


REPLIES = ["THINK: the key is two steps ahead. ACTION: go forward",
           "THINK: now it is right in front of me! ACTION: pick up key",
           "THINK: the door is to the left; 3 steps. ACTION: turn left",
           "THINK: done.\n\nACTION: toggle"]
OBSERVATIONS = ["You see a yellow key 2 steps forward and a wall 4 steps right.",
                "You see a yellow key 1 step forward.",
                "You carry a yellow key. You see a locked door 3 steps left.",
                "You see an open door."]


def test_full_history_chat_merges_into_one_row(qwen_tokenizer):
    tok = qwen_tokenizer
    episode, _ = chat_episode(tok, "e0", REPLIES, OBSERVATIONS)
    batch, report = merge_turns([episode], tokenizer=tok)
    assert report.rows == 1 and report.merged == 3 and report.turns == 4
    assert sum(v for v in report.splits.values()) == 0 and report.mismatches == []
    last = episode.turns[-1]
    assert batch.input_ids == [last.prompt_ids + last.response_ids]
    sampled = [i for i, m in zip(batch.input_ids[0], batch.loss_mask[0]) if m]
    assert sampled == [i for t in episode.turns for i in t.response_ids]
    # The "\n" after each <|im_end|> the model sampled is an observation token (mask 0).
    for s in batch.segments[:-1]:
        end = s.start + s.length
        assert batch.input_ids[0][end - 1] == IM_END and batch.input_ids[0][end] == 198
        assert batch.loss_mask[0][end] == 0
    assert report.as_metrics() == {"data/merge/turns": 4, "data/merge/rows": 1, "data/merge/merged": 3,
                                   "data/merge/split_template": 0, "data/merge/split_retoken": 0,
                                   "data/merge/split_other": 0, "data/merge/split_length": 0}


def _advantages(batch, episodes, turn_values, turn_logp, turn_logp_ref, ppo):
    """estimate_advantages on `batch`, with per-turn values/log-probs placed in the row layout and
    noise on every mask-0 token (which must not leak into the result). Returns [N, L] advantages."""
    index = TurnIndex.of(batch)
    data = Rows.of(batch, pad_id=151643)
    shape = data.input_ids.shape
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(1)) * (1 - data.loss_mask)
    data = dataclasses.replace(data, values_old=index.to_rows(turn_values, shape) + noise,
                               logp_old=index.to_rows(turn_logp, shape) + noise,
                               logp_ref=index.to_rows(turn_logp_ref, shape) - noise)
    ppo_batch = PPOBatch(episodes, batch, index, data,
                         bootstrap_values=torch.tensor([0.7] * len(batch.bootstrap_prompts)))
    estimate_advantages(ppo_batch, ppo)
    return index.to_turns(ppo_batch.rows.advantages), index.to_turns(ppo_batch.rows.returns)


def test_per_turn_and_merged_advantages_agree(qwen_tokenizer):
    tok = qwen_tokenizer
    finished, _ = chat_episode(tok, "e0", REPLIES, OBSERVATIONS, rewards=[0.0, 0.5, 0.0, 1.0])
    cut, _ = chat_episode(tok, "e1", REPLIES[:3], OBSERVATIONS[1:], rewards=[0.1, 0.0, -0.2])
    cut.turns[-1].terminated = False
    cut.bootstrap_prompt_ids = cut.turns[-1].prompt_ids + cut.turns[-1].response_ids + [198]
    episodes = [finished, cut]
    rows, merged_report = merge_turns(episodes, tokenizer=tok)
    turns = per_turn(episodes)
    assert merged_report.rows == 2 and len(turns.input_ids) == 7
    assert [(s.length, s.reward, s.episode_end, s.next_segment, s.bootstrap) for s in rows.segments] == \
        [(s.length, s.reward, s.episode_end, s.next_segment, s.bootstrap) for s in turns.segments]
    assert rows.bootstrap_prompts == turns.bootstrap_prompts

    width = max(s.length for s in turns.segments)
    g = torch.Generator().manual_seed(0)
    mask = TurnIndex.of(turns).mask
    values, logp, logp_ref = (torch.randn(len(turns.segments), width, generator=g) * mask for _ in range(3))
    ppo = PPOConfig(gamma_step=0.9, lambda_step=0.8, gamma_token=0.99, lambda_token=0.97,
                    kl_coef=0.1, whiten_advantages=False)
    adv_rows, ret_rows = _advantages(rows, episodes, values, logp, logp_ref, ppo)
    adv_turns, ret_turns = _advantages(turns, episodes, values, logp, logp_ref, ppo)
    assert adv_turns.abs().sum() > 0
    torch.testing.assert_close(adv_rows, adv_turns)
    torch.testing.assert_close(ret_rows, ret_turns)


# ---------------------------------------------------------------- planted mismatches

def _break(tok, replies, history=lambda reply: reply):
    episode, _ = chat_episode(tok, "p", replies, OBSERVATIONS, history=history)
    batch, report = merge_turns([episode], tokenizer=tok)
    assert report.rows == 2 and report.merged == 0
    assert len(report.mismatches) == 1
    return episode, batch, report


def test_bpe_resplit_is_retoken(qwen_tokenizer):
    tok = qwen_tokenizer
    having = encode(tok, " H") + [i for c in "AVING" for i in encode(tok, c)]  # sampled " H", A, V, I, N, G
    assert having != encode(tok, " HAVING")
    first = encode(tok, "THINK:") + having + encode(tok, " a key. ACTION: go") + [IM_END]
    episode, _, report = _break(tok, [first, REPLIES[1]])
    (m,) = report.mismatches
    assert report.splits == {"template": 0, "retoken": 1, "other": 0, "length": 0}
    assert m["class"] == "retoken" and m["episode_id"] == "p" and m["turn"] == 1
    assert m["expected_ids"] == episode.turns[0].prompt_ids + first
    assert m["expected_text"] == m["actual_text"] and m["actual_ids"] != m["expected_ids"]
    # " H" agrees, "AVING" does not
    assert m["common_prefix"] == len(episode.turns[0].prompt_ids) + len(encode(tok, "THINK: H"))


def test_spelled_out_special_token_is_retoken(qwen_tokenizer):
    tok = qwen_tokenizer
    spelled = tok.encode("<|im_end|>", add_special_tokens=False, split_special_tokens=True)
    assert len(spelled) > 1 and IM_END not in spelled
    first = encode(tok, "ACTION: go forward") + spelled  # the model wrote the text of <|im_end|>
    # The agent's history keeps the text before the spelled-out end marker; the template re-adds
    # <|im_end|> as one id.
    _, _, report = _break(tok, [first, REPLIES[1]], history=lambda text: text.removesuffix("<|im_end|>"))
    assert report.mismatches[0]["class"] == "retoken" and report.splits["retoken"] == 1


def test_template_dropping_newline_after_im_end_is_template(qwen_tokenizer):
    tok = qwen_tokenizer
    episode, _ = chat_episode(tok, "t", REPLIES[:2], OBSERVATIONS)
    # Re-render the second prompt with a template that drops "\n" after <|im_end|>.
    text = tok.decode(episode.turns[1].prompt_ids).replace("<|im_end|>\n", "<|im_end|>")
    episode.turns[1].prompt_ids = encode(tok, text)
    batch, report = merge_turns([episode], tokenizer=tok)
    assert report.splits == {"template": 1, "retoken": 0, "other": 0, "length": 0}
    assert report.mismatches[0]["class"] == "template"


def test_template_dropping_eos_is_template(qwen_tokenizer):
    tok = qwen_tokenizer
    episode, _ = chat_episode(tok, "t", REPLIES[:2], OBSERVATIONS)
    text = tok.decode(episode.turns[1].prompt_ids)
    reply_end = REPLIES[0] + "<|im_end|>\n"
    episode.turns[1].prompt_ids = encode(tok, text.replace(reply_end, REPLIES[0] + "\n"))
    _, report = merge_turns([episode], tokenizer=tok)
    assert report.mismatches[0]["class"] == "template"


def test_history_rewrite_is_other(qwen_tokenizer):
    tok = qwen_tokenizer
    strip_think = lambda text: text[text.index("ACTION:"):]  # noqa: E731
    _, _, report = _break(tok, REPLIES[:2], history=strip_think)
    m = report.mismatches[0]
    assert m["class"] == "other" and report.splits["other"] == 1
    assert "THINK" in m["expected_text"] and m["expected_text"] != m["actual_text"]


def test_write_mismatches(qwen_tokenizer, tmp_path):
    tok = qwen_tokenizer
    _, _, report = _break(tok, REPLIES[:2], history=lambda text: text.upper())
    report.mismatches.append(dict(report.mismatches[0], turn=7))
    path = tmp_path / "debug" / "mismatches.jsonl"
    assert write_mismatches(report, path) == 2
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 2 and [r["turn"] for r in lines] == [1, 7]
    for record in lines:
        fields = {"episode_id", "turn", "class", "expected_ids", "actual_ids", "expected_text", "actual_text"}
        assert fields <= set(record)
        assert tok.decode(record["expected_ids"]) == record["expected_text"]
        assert tok.decode(record["actual_ids"]) == record["actual_text"]
    write_mismatches(report, path)  # appends
    assert len(path.read_text().splitlines()) == 4
