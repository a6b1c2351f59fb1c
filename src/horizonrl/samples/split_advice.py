"""What a run is told when its merged rows split on most turns: which class of break dominates (samples/merge.py
classifies every break), what it means and what to do.

A turn that could have merged is any turn but its episode's first: it either merged into its row or split
(started a row of its own). Rows that split stay exact (each turn is trained on the very prompt it was
sampled from), but every split turn costs a forward pass over its whole prompt: updates slow down as the
history grows. When over half of an iteration's turns that could have merged split (`MOSTLY`), the advice
names the class with the most splits.
"""

from __future__ import annotations

from horizonrl.samples.merge import SPLIT_CLASSES

MOSTLY = 0.5    # a share of split turns, of those that could have merged, above which the run is told why

PER_TURN = "or accept it: `samples: per_turn` trains the same rows without trying to merge"
MEANING = {   # class -> (what it means, what to do)
    "template": (
        ("the agent's history renders through the chat template with other special tokens (or other whitespace "
         "around them) than the model sampled: typically an agent that sends the model's tool calls back as "
         "assistant text, not as `tool_calls` messages, or drops or adds an end-of-turn token"),
        ("send each assistant message back as the gateway returned it (its content and its `tool_calls`); "
         + PER_TURN)),
    "retoken": (
        ("the agent sends back the text the model sampled, but it tokenises differently once re-rendered (BPE "
         "splits a word another way, merges across the turn boundary, or a special token the model spelled out "
         "in pieces becomes one token): the tokenizer's doing, not the agent's"),
        "nothing in the agent to fix; " + PER_TURN),
    "other": (
        ("the agent changes its history's text between calls: it rewrites or re-formats the model's answers "
         "(e.g. sends its tool calls back as text of its own format, strips reasoning) or drops earlier messages "
         "(a sliding window)"),
        ("send the model's messages back unchanged (tool calls as `tool_calls` messages) and keep the whole "
         "history; " + PER_TURN)),
    "length": (
        "rows reach `merge.max_response_len`, so a long episode is cut into several rows",
        "raise `merge.max_response_len` (or set it to null) if memory allows"),
}


def split_advice(record: dict) -> str | None:
    """None unless over MOSTLY of the turns of `record` (an iteration's, with its `data/merge/*` counts) that
    could have merged split; else what the class with the most splits means and what to do."""
    splits = {name: record[f"data/merge/split_{name}"] for name in SPLIT_CLASSES}
    split = sum(splits.values())
    could_merge = record["data/merge/merged"] + split
    if split <= MOSTLY * could_merge:
        return None
    dominant = max(SPLIT_CLASSES, key=splits.get)
    meaning, remedy = MEANING[dominant]
    return (f"iteration {record['iteration']}: {split} of the {could_merge} turns that could have merged into their "
            f"episode's row started a row of their own, {splits[dominant]} of them `{dominant}` splits: {meaning}. "
            "Such a call's prompt does not extend the previous prompt + response, so its turn is trained as a row "
            "of its own: exactly, but at the cost of a forward pass over its whole prompt (slower updates). What "
            f"to do: {remedy}. `data/merge/split_*` counts the splits per iteration; merge.debug=true writes each "
            "one, with the expected and the actual text, to merge_mismatches.jsonl in the run folder. (Told once "
            "per run.)")
