"""merge_turns: one training row per run of turns whose prompts extend the previous prompt + response.

An agent that keeps its whole conversation sends prompt_{k+1} = prompt_k + response_k + obs_k (obs_k:
the template's end-of-turn tokens, the env's observation, the next generation header). All turns of
such a run fit in one row

    prompt_0 | response_0 | obs_0 | response_1 | obs_1 | ... | response_n
       0     |     1      |   0   |     1      |   0   | ... |     1        (loss mask)

which costs one forward pass instead of n + 1 over ever longer prompts. Each turn still gets its own
`Segment` with exactly the semantics of `per_turn` (same order, same rewards, `episode_end`,
`next_segment` links to the next turn of the episode, even one in another row, bootstrap prompt for
the last turn of a fragment that did not terminate), so GAE in the turn layout is the same for both
builders; only `row` and `start` differ. Token-in, token-out: rows are built from the recorded ids
only, never from text.

A turn whose prompt does not start with exactly the previous turn's prompt + response ids starts a
new row (a *break*). Breaks are classified with the tokenizer, comparing expected = prev prompt + prev
response against the new prompt (`classify_mismatch`; texts decoded with special tokens kept):

1. `retoken`: the decoded new prompt starts with the expected text: the ids differ, the text does
   not. BPE re-splits ("HAVING" sampled as H+AVING, re-encoded HAV+ING), merges across the turn
   boundary ("!" + "\\n\\n"), and a special token the model spelled out as text pieces ("<", "|",
   "im", "_end", "|", ">") that collapses to one id when re-encoded all land here: the decoded text
   is the same, so this is a tokenisation issue, not a template one, even though the special-id
   sequences differ.
2. `template`: otherwise, if the sequences of special/added-token ids differ (expected's specials vs
   the same number of leading specials of the new prompt: a dropped or added `<|im_end|>` or
   `<|im_start|>`), or the texts agree once whitespace adjacent to special tokens is removed (a
   template that drops the "\\n" after `<|im_end|>`).
3. `other`: the text differs (an agent that strips THINK from its history, regex post-processing,
   a sliding memory window, normalisation of whitespace away from special tokens).

Without a tokenizer every break is `other`. Every break is counted in `MergeReport.splits` and
recorded in `MergeReport.mismatches` (see `write_mismatches`).

Limits (as Agent Lightning's trajectory limits): `max_prompt_len` bounds the first prompt of a row,
`max_response_len` everything after it (responses and observations). A turn that would push a row
past `max_response_len` starts a new row (counted as a `length` split). A row's first prompt longer
than `max_prompt_len`, or a single turn's response longer than `max_response_len`, raises
ValueError naming the episode and turn: sampled tokens are never dropped or truncated. Set
`max_prompt_len` at least to the engine's prompt limit, since a length split makes a late, long
prompt the first prompt of its row.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from horizonrl.records import Episode, SampleBatch, Segment
from horizonrl.samples.per_turn import check_turn

SPLIT_CLASSES = ("template", "retoken", "other", "length")


@dataclass
class MergeReport:
    """What `merge_turns` did: turns in, rows out, turns appended to a row, and the splits by class.

    `mismatches` holds one dict per prefix break: episode_id, turn (index in the fragment), class,
    common_prefix (number of leading ids that agree), expected_ids (prev prompt + prev response),
    actual_ids (the new prompt over the same span) and, with a tokenizer, expected_text/actual_text.
    """

    turns: int = 0
    rows: int = 0
    merged: int = 0
    splits: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPLIT_CLASSES, 0))
    mismatches: list[dict] = field(default_factory=list)

    def as_metrics(self) -> dict[str, float]:
        metrics = {"data/merge/turns": self.turns, "data/merge/rows": self.rows,
                   "data/merge/merged": self.merged}
        for name in SPLIT_CLASSES:
            metrics[f"data/merge/split_{name}"] = self.splits.get(name, 0)
        return metrics


def merge_turns(
    episodes: list[Episode],
    max_prompt_len: int | None = None,
    max_response_len: int | None = None,
    tokenizer=None,
) -> tuple[SampleBatch, MergeReport]:
    """Rows of maximal prefix-extending runs of turns; segments in the same order as `per_turn`."""
    input_ids: list[list[int]] = []
    loss_mask: list[list[int]] = []
    segments: list[Segment] = []
    bootstrap_prompts: list[list[int]] = []
    report = MergeReport()
    special = _special_ids(tokenizer)

    for episode in episodes:
        row_open = False  # the current row belongs to this episode and may be extended
        first_prompt_len = 0
        for k, turn in enumerate(episode.turns):
            where = f"episode {episode.episode_id} turn {k}"
            bootstrap = check_turn(episode, k, bootstrap_prompts)
            last = k == len(episode.turns) - 1
            report.turns += 1

            append = False
            if row_open:
                prev = episode.turns[k - 1]
                expected = prev.prompt_ids + prev.response_ids
                if turn.prompt_ids[: len(expected)] == expected:
                    after_prompt = len(input_ids[-1]) - first_prompt_len
                    grow = len(turn.prompt_ids) - len(expected) + len(turn.response_ids)
                    if max_response_len is not None and after_prompt + grow > max_response_len:
                        report.splits["length"] += 1
                    else:
                        append = True
                else:
                    kind, detail = classify_mismatch(expected, turn.prompt_ids, tokenizer, special)
                    report.splits[kind] += 1
                    report.mismatches.append({"episode_id": episode.episode_id, "turn": k, "class": kind,
                                              **detail})

            if append:
                row, mask = input_ids[-1], loss_mask[-1]
                observation = turn.prompt_ids[len(row):]
                row.extend(observation)
                mask.extend([0] * len(observation))
                report.merged += 1
            else:
                if max_prompt_len is not None and len(turn.prompt_ids) > max_prompt_len:
                    raise ValueError(f"{where}: prompt of {len(turn.prompt_ids)} tokens starts a row and "
                                     f"exceeds max_prompt_len={max_prompt_len}")
                if max_response_len is not None and len(turn.response_ids) > max_response_len:
                    raise ValueError(f"{where}: response of {len(turn.response_ids)} tokens exceeds "
                                     f"max_response_len={max_response_len}")
                row, mask = list(turn.prompt_ids), [0] * len(turn.prompt_ids)
                input_ids.append(row)
                loss_mask.append(mask)
                first_prompt_len = len(row)
                report.rows += 1
                row_open = True

            segments.append(Segment(
                row=len(input_ids) - 1, start=len(row), length=len(turn.response_ids),
                reward=turn.reward, episode_end=turn.terminated,
                next_segment=-1 if last else len(segments) + 1, bootstrap=bootstrap,
            ))
            row.extend(turn.response_ids)
            mask.extend([1] * len(turn.response_ids))
    return SampleBatch(input_ids, loss_mask, segments, bootstrap_prompts), report


def classify_mismatch(expected: list[int], actual: list[int], tokenizer=None,
                      special: dict[int, str] | None = None) -> tuple[str, dict]:
    """Class of a prefix break ('retoken', 'template' or 'other'; rule in the module docstring) and the
    debug record: common_prefix, expected_ids, actual_ids (+ texts with a tokenizer)."""
    common = 0
    for a, b in zip(expected, actual):
        if a != b:
            break
        common += 1
    detail: dict = {"common_prefix": common, "expected_ids": list(expected)}
    if tokenizer is None:
        detail["actual_ids"] = list(actual[: len(expected)])
        return "other", detail
    if special is None:
        special = _special_ids(tokenizer)

    expected_text = _decode(tokenizer, expected)
    actual_text = _decode(tokenizer, actual)
    span = _text_span(tokenizer, actual, len(expected_text))
    detail["actual_ids"] = list(actual[:span])
    detail["expected_text"] = expected_text
    detail["actual_text"] = _decode(tokenizer, actual[:span])

    if actual_text.startswith(expected_text):
        return "retoken", detail
    expected_specials = [i for i in expected if i in special]
    actual_specials = [i for i in actual if i in special][: len(expected_specials)]
    if expected_specials != actual_specials:
        return "template", detail
    strip = _whitespace_around(special.values())
    if strip is not None and strip.sub(r"\1", actual_text).startswith(strip.sub(r"\1", expected_text)):
        return "template", detail
    return "other", detail


def write_mismatches(report: MergeReport, path: str | Path, append: bool = True) -> int:
    """Write one JSON line per mismatch of `report` to `path` (appending by default, so one file can
    collect every iteration); returns the number of lines written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a" if append else "w", encoding="utf-8") as f:
        for record in report.mismatches:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return len(report.mismatches)


def _special_ids(tokenizer) -> dict[int, str]:
    """Special and added tokens of `tokenizer`: id -> text."""
    if tokenizer is None:
        return {}
    out: dict[int, str] = {}
    for i, token in getattr(tokenizer, "added_tokens_decoder", {}).items():
        out[int(i)] = str(token)
    for i in getattr(tokenizer, "all_special_ids", []):
        out.setdefault(int(i), tokenizer.convert_ids_to_tokens(int(i)))
    return out


def _decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _text_span(tokenizer, ids: list[int], n_chars: int) -> int:
    """Smallest m (by bisection) such that decode(ids[:m]) covers n_chars characters."""
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(_decode(tokenizer, ids[:mid])) >= n_chars:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _whitespace_around(tokens) -> re.Pattern | None:
    tokens = sorted((t for t in tokens if t), key=len, reverse=True)
    if not tokens:
        return None
    return re.compile(r"\s*(" + "|".join(re.escape(t) for t in tokens) + r")\s*")
