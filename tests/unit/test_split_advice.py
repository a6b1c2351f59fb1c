"""split_advice (samples/split_advice.py): nothing unless over half of the turns that could have merged split;
then the class with the most splits, what it means and what to do."""

import pytest

from horizonrl.samples.merge import SPLIT_CLASSES
from horizonrl.samples.split_advice import MEANING, split_advice


def record(merged: int, **splits: int) -> dict:
    """An iteration's record with its data/merge/* counts (16 episodes: their first turns never merge)."""
    counts = {f"data/merge/split_{name}": splits.get(name, 0) for name in SPLIT_CLASSES}
    return {"iteration": 3, "data/merge/turns": 16 + merged + sum(splits.values()), "data/merge/merged": merged,
            **counts}


def test_half_or_fewer_split_turns_are_not_reported():
    assert split_advice(record(merged=10)) is None
    assert split_advice(record(merged=5, template=5)) is None          # exactly half: not most
    assert split_advice(record(merged=0)) is None                      # single-turn episodes: nothing could merge


@pytest.mark.parametrize("dominant", SPLIT_CLASSES)
def test_the_class_with_the_most_splits_is_named_with_its_meaning_and_remedy(dominant):
    splits = dict.fromkeys(SPLIT_CLASSES, 1) | {dominant: 6}             # 9 of 13 split, 6 of them `dominant`
    advice = split_advice(record(merged=4, **splits))
    meaning, remedy = MEANING[dominant]
    assert advice.startswith(f"iteration 3: 9 of the 13 turns that could have merged into their episode's row "
                             f"started a row of their own, 6 of them `{dominant}` splits: {meaning}. ")
    assert f"What to do: {remedy}." in advice and "merge_mismatches.jsonl" in advice


def test_tool_calls_sent_back_as_text_are_named_where_they_split():
    assert "tool calls back as assistant text, not as `tool_calls` messages" in MEANING["template"][0]
    assert "sends its tool calls back as text" in MEANING["other"][0]
    assert "samples: per_turn" in MEANING["retoken"][1]
