"""Turning a response into an env action.

The action is the text after the last `ACTION:`, first line only, normalised (lower case, outer
whitespace, quotes and punctuation removed from both ends, inner whitespace collapsed), then looked up in
the translation table of near-misses and matched exactly against the env's action names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ACTION_TAG = "ACTION:"
THINK_TAG = "THINK:"


@dataclass(frozen=True)
class Decision:
    """What the agent does with one response: the executed action and what goes into the history."""

    action: str       # the action executed (the default one when the response was invalid)
    valid: bool       # the response named a valid action
    think: str        # the reasoning part of the response
    raw_action: str | None   # the text after the last ACTION:, None if there is none


def normalise(text: str) -> str:
    first_line = text.strip().splitlines()[0] if text.strip() else ""
    return re.sub(r"\s+", " ", first_line.strip(" \t\"'`*.!,;:")).lower()


def decide(response_text: str, actions: list[str], default_action: str,
           translations: dict[str, str] | None = None) -> Decision:
    """Parse a THINK/ACTION response; fall back to `default_action` when no valid action is named."""
    cut = response_text.rfind(ACTION_TAG)
    head = response_text if cut < 0 else response_text[:cut]
    think_at = head.find(THINK_TAG)
    think = (head[think_at + len(THINK_TAG):] if think_at >= 0 else head).strip()
    if cut < 0:
        return Decision(default_action, False, think, None)
    raw = response_text[cut + len(ACTION_TAG):]
    name = normalise(raw)
    name = (translations or {}).get(name, name)
    by_name = {a.lower(): a for a in actions}
    if name in by_name:
        return Decision(by_name[name], True, think, raw.strip())
    return Decision(default_action, False, think, raw.strip())
