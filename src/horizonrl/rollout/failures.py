"""Failed rollouts: their causes summarised, and the error of a batch in which none succeeded.

A collector keeps the cause of every failure of its last batch in `errors` (an agent that raised, an env
call that failed: one string each, with no episode id, so that equal causes are equal strings). It logs
each one at DEBUG and the batch's at once with `log_failures`: one warning naming the distinct causes, the
most common first, each with its count (`summary_lines`).

A batch in which nothing succeeded (every episode of a group batch dropped, every teacher rollout of the
warm start's first batch failed) leaves nothing to train on: `raise_if_none_succeeded` raises
RolloutsFailed, whose message is that summary. Under torchrun every rank raises the same error (they agree
with `Ranks.max` first, so no rank is left waiting in a collective for another). The CLI prints it as one
message (exit status 1); nothing is saved on the way out.
"""

from __future__ import annotations

import logging
from collections import Counter

from horizonrl.learner.distributed import LOCAL, Ranks

log = logging.getLogger(__name__)
MOST_COMMON = 3       # causes a summary names; the others are counted together
CAUSE_CHARS = 300     # a cause longer than this is cut in a summary (one line: its whitespace collapsed)


class RolloutsFailed(RuntimeError):
    """Every rollout of a batch failed, so there is nothing to train on; the message names the causes."""


def summary_lines(causes: list[str]) -> list[str]:
    """"cause (count)" for the MOST_COMMON most common of `causes` (most common first), then one line counting
    the rest."""
    counts = Counter(causes)
    common = counts.most_common(MOST_COMMON)
    lines = [f"{shorten(cause)} ({n})" for cause, n in common]
    if rest := len(causes) - sum(n for _, n in common):
        lines.append(f"{rest} more of {len(counts) - len(common)} other cause{'s' * (len(counts) - len(common) > 1)}")
    return lines


def shorten(cause: str) -> str:
    """`cause` on one line, at most CAUSE_CHARS characters."""
    line = " ".join(cause.split())
    return line if len(line) <= CAUSE_CHARS else line[:CAUSE_CHARS - 3] + "..."


def log_failures(causes: list[str], what: str) -> None:
    """One warning for a batch's failures, if any: "<number> <what>: <summary>" (`what`, e.g. "of 64 rollouts
    dropped from their groups")."""
    if causes:
        log.warning("%d %s: %s", len(causes), what, "; ".join(summary_lines(causes)))


def raise_if_none_succeeded(succeeded: int, attempted: int, causes: list[str], subject: str, consequence: str,
                            ranks: Ranks = LOCAL) -> None:
    """Returns when every rank had one of its `attempted` rollouts succeed; else every rank raises the same
    RolloutsFailed: "every <subject> failed (<failed> of <attempted>[ on ranks ...]), so <consequence>", then
    the causes of every rank's failures, the most common first."""
    if not ranks.max(int(succeeded == 0)):
        return
    shares = ranks.gather((attempted, succeeded, causes))
    failed = sum(n - ok for n, ok, _ in shares)
    if ranks.world_size == 1:
        where = f"{subject} failed ({failed} of {attempted})"
    else:
        empty = [str(rank) for rank, (_, ok, _) in enumerate(shares) if ok == 0]
        where = (f"{subject} on rank{'s' * (len(empty) > 1)} {', '.join(empty)} failed (failed per rank: "
                 + ", ".join(f"{n - ok} of {n}" for n, ok, _ in shares) + ")")
    lines = summary_lines([cause for _, _, share in shares for cause in share])
    raise RolloutsFailed(f"every {where}, so {consequence}; the failures, most common first:\n  "
                         + "\n  ".join(lines))
