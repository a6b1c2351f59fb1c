import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from horizonrl.records import Episode, Turn
from horizonrl.samples import per_turn
from horizonrl.samples.merge import MergeReport, merge_turns


def turn(prompt, response, reward=0.0, terminated=False, truncated=False):
    return Turn(list(prompt), list(response), [-0.5] * len(response), reward, terminated, truncated)


# ---------------------------------------------------------------- planted mismatches
# (classified with the exact Qwen2.5 template and tokenizer: tests/integration/test_merge_qwen.py)

def test_without_tokenizer_every_break_is_other():
    episode = Episode("a", "t", 0, turns=[turn([1, 2], [3]), turn([1, 2, 9, 4], [5], terminated=True)])
    batch, report = merge_turns([episode])
    assert report.splits["other"] == 1 and batch.input_ids == [[1, 2, 3], [1, 2, 9, 4, 5]]
    assert report.mismatches == [{"episode_id": "a", "turn": 1, "class": "other", "common_prefix": 2,
                                  "expected_ids": [1, 2, 3], "actual_ids": [1, 2, 9]}]


# ---------------------------------------------------------------- limits

def test_max_response_len_forces_a_counted_split():
    t0 = turn([1, 2], [3, 4])
    t1 = turn([1, 2, 3, 4, 5], [6, 7])             # +3 after the first prompt -> 5
    t2 = turn([1, 2, 3, 4, 5, 6, 7, 8], [9], terminated=True)  # +2 -> 7 > 6: new row
    episode = Episode("a", "t", 0, turns=[t0, t1, t2])
    batch, report = merge_turns([episode], max_prompt_len=10, max_response_len=6)
    assert batch.input_ids == [[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9]]
    assert batch.loss_mask == [[0, 0, 1, 1, 0, 1, 1], [0] * 8 + [1]]
    assert report.splits["length"] == 1 and report.rows == 2 and report.merged == 1
    assert report.mismatches == []
    segments = [(s.row, s.start, s.length, s.next_segment) for s in batch.segments]
    assert segments == [(0, 2, 2, 1), (0, 5, 2, 2), (1, 8, 1, -1)]
    unlimited, _ = merge_turns([episode])
    assert unlimited.input_ids == [[1, 2, 3, 4, 5, 6, 7, 8, 9]]


def test_overlong_prompt_or_response_is_a_clear_error():
    episode = Episode("ep7", "t", 0, turns=[turn([1, 2, 3], [4], terminated=True)])
    with pytest.raises(ValueError, match=r"episode ep7 turn 0.*max_prompt_len=2"):
        merge_turns([episode], max_prompt_len=2)
    long = Episode("ep8", "t", 0, turns=[turn([1], [2]), turn([1, 2, 3], [4, 5, 6, 7], terminated=True)])
    with pytest.raises(ValueError, match=r"episode ep8 turn 1.*max_response_len=3"):
        merge_turns([long], max_response_len=3)
    with pytest.raises(ValueError, match="empty response"):
        merge_turns([Episode("a", "t", 0, turns=[turn([1], [], terminated=True)])])
    with pytest.raises(ValueError, match="no bootstrap prompt"):
        merge_turns([Episode("a", "t", 0, turns=[turn([1], [2])])])


# ---------------------------------------------------------------- properties

ids = st.lists(st.integers(0, 50), max_size=6)


@st.composite
def episodes(draw):
    out = []
    for e in range(draw(st.integers(1, 4))):
        n = draw(st.integers(1, 5))
        prompt = draw(ids)
        turns = []
        for k in range(n):
            response = draw(st.lists(st.integers(100, 150), min_size=1, max_size=5))  # sampled ids >= 100
            turns.append(turn(prompt, response, reward=float(k), terminated=k == n - 1 and draw(st.booleans())))
            full = prompt + response
            mode = draw(st.sampled_from(["extend", "extend", "fresh", "edit"]))
            if mode == "extend":
                prompt = full + draw(ids)
            elif mode == "fresh":
                prompt = draw(ids)
            else:  # change one id of the history
                i = draw(st.integers(0, len(full) - 1))
                prompt = full[:i] + [full[i] + 1000] + full[i + 1:] + draw(ids)
        bootstrap = None if turns[-1].terminated else prompt
        out.append(Episode(f"e{e}", "t", e, turns=turns, bootstrap_prompt_ids=bootstrap))
    return out


@settings(max_examples=200, deadline=None)
@given(episodes(), st.one_of(st.none(), st.integers(5, 30)))
def test_merge_invariants(eps, max_response_len):
    batch, report = merge_turns(eps, max_response_len=max_response_len)  # responses have <= 5 ids
    reference = per_turn(eps)
    all_turns = [t for e in eps for t in e.turns]
    assert all(len(r) == len(m) for r, m in zip(batch.input_ids, batch.loss_mask))
    assert sum(map(sum, batch.loss_mask)) == sum(len(t.response_ids) for t in all_turns)
    for seg, t in zip(batch.segments, all_turns, strict=True):
        row, mask = batch.input_ids[seg.row], batch.loss_mask[seg.row]
        assert row[seg.start: seg.start + seg.length] == t.response_ids
        assert mask[seg.start: seg.start + seg.length] == [1] * seg.length
    for row, mask in zip(batch.input_ids, batch.loss_mask):
        assert all(i >= 100 and i < 1000 for i, m in zip(row, mask) if m)  # no observation id has mask 1
    assert len(batch.segments) == len(reference.segments)
    assert [(s.length, s.reward, s.episode_end, s.next_segment, s.bootstrap) for s in batch.segments] == \
        [(s.length, s.reward, s.episode_end, s.next_segment, s.bootstrap) for s in reference.segments]
    assert batch.bootstrap_prompts == reference.bootstrap_prompts
    assert report.turns == len(all_turns) == report.rows + report.merged
    assert report.rows == len(batch.input_ids)
    assert report.rows == len(eps) + sum(report.splits.values())
    assert isinstance(report, MergeReport)
    # Every row starts with its first turn's prompt, and each segment's prompt precedes it exactly.
    for seg, t in zip(batch.segments, all_turns):
        assert batch.input_ids[seg.row][: seg.start] == t.prompt_ids
