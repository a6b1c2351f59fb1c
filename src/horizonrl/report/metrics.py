"""Metrics: one JSON object per iteration in runs/<name>/metrics.jsonl, namespaced keys.

Episode statistics (`env/*`, and `env/<task>/success_rate` per task of a multi-task run) are over the
episodes that finished in the iteration (not those closed by an env error: they are counted in
`env/errored_episodes`); per-turn ones over every turn collected in it, including the numbers an env
reports in `info["metrics"]` at each step and the engine's failed calls that were retried
(`rollout/engine_retries`; engines/retry.py).

Under torchrun they cover every rank's episodes, yet no episode crosses the ranks: each rank sums its
own (`EpisodeTotals`: a few numbers per metric and the first invalid outputs), the ranks' totals are
added, and the means are taken last.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from horizonrl.learner.distributed import LOCAL, Ranks
from horizonrl.records import Episode


@dataclass
class EpisodeTotals:
    """Sums and counts over some episodes from which their statistics follow (`metrics()`). The totals
    of disjoint sets of episodes (the ranks' shares) add up to those of their union, so the statistics
    of every rank's episodes need only each rank's totals, whose size depends on the metric names and
    not on the episodes.

    `sums[(kind, name)]` adds up a statistic's values; `counts[(kind, name)]` counts them for the
    statistics reported as means (NaN when there are none); the others are reported as their int sum.
    Kinds: "step" (`env/<name>`, the numbers envs report in info["metrics"]), "episode" (the statistics
    of every record), "tool" (the calls of agent-loop turns), "tool_error" (failed tool calls by kind),
    "task" (success of the finished episodes by task). `invalid_outputs`: see `distinct_prefixes`."""

    sums: Counter = field(default_factory=Counter)
    counts: Counter = field(default_factory=Counter)
    invalid_outputs: list[str] = field(default_factory=list)

    def add(self, kind: str, name: str, total: float, count: int | None = None) -> None:
        """Add `total` to a statistic; with `count`, to one reported as a mean over that many values.
        (Stored as floats: the totals of any share pickle to the same size.)"""
        self.sums[(kind, name)] += float(total)
        if count is not None:
            self.counts[(kind, name)] += count

    def __add__(self, other: EpisodeTotals) -> EpisodeTotals:
        sums, counts = Counter(self.sums), Counter(self.counts)
        sums.update(other.sums)
        counts.update(other.counts)
        return EpisodeTotals(sums, counts, distinct_prefixes(self.invalid_outputs + other.invalid_outputs))

    def of_kind(self, kind: str) -> dict[str, float]:
        """The statistics of one kind by name, in the order first added: means as floats, the others as ints."""
        out: dict[str, float] = {}
        for key, total in self.sums.items():
            if key[0] != kind:
                continue
            if key not in self.counts:
                out[key[1]] = int(total)
            else:
                out[key[1]] = total / self.counts[key] if self.counts[key] else math.nan
        return out

    def metrics(self) -> dict[str, float]:
        """The record's episode statistics: tool statistics only when some turn called a tool, success and
        finished episodes per task only when the finished episodes span several tasks."""
        tools, tasks = self.of_kind("tool"), self.of_kind("task")
        if tools.get("rollout/tool_calls"):
            errors = {f"rollout/tool_errors/{kind}": n for kind, n in self.of_kind("tool_error").items()}
            tools.update({"rollout/tool_errors": sum(errors.values()), **errors})
        else:
            tools = {}
        per_task = {}
        if len(tasks) > 1:
            for task, rate in sorted(tasks.items()):
                per_task[f"env/{task}/success_rate"] = rate
                per_task[f"env/{task}/episodes"] = int(self.counts[("task", task)])
        return {**self.of_kind("step"), **self.of_kind("episode"), "env/invalid_output_examples": self.invalid_outputs,
                **tools, **per_task}


def episode_totals(episodes: list[Episode]) -> EpisodeTotals:
    """The totals of `episodes` (see EpisodeTotals)."""
    finished = [e for e in episodes if e.finished and "error" not in e.metrics]
    turns = [t for e in episodes for t in e.turns]
    calls = [call for t in turns for call in t.info.get("tool_calls", [])]
    totals = EpisodeTotals(invalid_outputs=distinct_prefixes([t.info["invalid_output"] for t in turns
                                                              if t.info.get("invalid_output") is not None]))
    for t in turns:
        for name, value in t.info.get("metrics", {}).items():
            totals.add("step", f"env/{name}", value, 1)
    for name, value in {   # a list: reported as its mean; a number: as it is
        "env/episodes": len(finished),
        "env/success_rate": [e.metrics["success"] for e in finished],
        "env/episode_return": [e.metrics["return"] for e in finished],
        "env/episode_length": [e.metrics["length"] for e in finished],
        "env/valid_action_ratio": [float(t.valid_action) for t in turns],
        "env/errored_episodes": sum("error" in e.metrics for e in episodes),
        "env/turns": len(turns),
        "rollout/response_length": [len(t.response_ids) for t in turns],
        "rollout/prompt_length": [len(t.prompt_ids) for t in turns],
        "rollout/truncated_responses": sum(t.info.get("finish_reason") == "length" for t in turns),
        "rollout/engine_retries": sum(t.info.get("engine_retries", 0) for t in turns),
        "rollout/tool_call_parse_failures": sum(t.info.get("tool_call_parse_failed", False) for t in turns),
    }.items():
        totals.add("episode", name, *((sum(value), len(value)) if isinstance(value, list) else (value,)))
    totals.add("tool", "rollout/tool_calls", len(calls))
    for call in calls:
        if call["error"] is not None:
            totals.add("tool_error", call["error"], 1)
    for e in finished:
        totals.add("task", e.task, e.metrics["success"], 1)
    return totals


def episode_metrics(episodes: list[Episode], ranks: Ranks = LOCAL) -> dict[str, float]:
    """The statistics of every rank's `episodes` (this process's alone outside torchrun), the same on
    every rank (every rank calls): the ranks' totals are gathered and added in rank order."""
    return sum(ranks.gather(episode_totals(episodes)), EpisodeTotals()).metrics()


def distinct_prefixes(texts: list[str], limit: int = 3, chars: int = 80) -> list[str]:
    """The first `limit` distinct `chars`-character prefixes of `texts`. Applied to the concatenation of
    the results for consecutive parts of a list, it gives the result for the whole list."""
    out: list[str] = []
    for text in texts:
        if len(out) == limit:
            break
        if text[:chars] not in out:
            out.append(text[:chars])
    return out


class MetricsLog:
    """Appends one JSON line per record; NaN is written as null."""

    def __init__(self, path: Path):
        self.path = path

    def write(self, record: dict) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(clean) + "\n")


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
