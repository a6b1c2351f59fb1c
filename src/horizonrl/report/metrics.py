"""Metrics: one JSON object per iteration in runs/<name>/metrics.jsonl, namespaced keys.

Episode statistics (`env/*`, and `env/<task>/success_rate` per task of a multi-task run) are over the
episodes that finished in the iteration (not those closed by an env error: they are counted in
`env/errored_episodes`); per-turn ones over every turn collected in it, including the numbers an env
reports in `info["metrics"]` at each step and the engine's failed calls that were retried
(`rollout/engine_retries`; engines/retry.py).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

from horizonrl.records import Episode


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def episode_metrics(episodes: list[Episode]) -> dict[str, float]:
    finished_episodes = [e for e in episodes if e.finished and "error" not in e.metrics]
    finished = [e.metrics for e in finished_episodes]
    turns = [t for e in episodes for t in e.turns]
    step_metrics: dict[str, list[float]] = {}
    for t in turns:
        for name, value in t.info.get("metrics", {}).items():
            step_metrics.setdefault(f"env/{name}", []).append(value)
    return {
        **{name: mean(values) for name, values in step_metrics.items()},
        "env/episodes": len(finished),
        "env/success_rate": mean([m["success"] for m in finished]),
        "env/episode_return": mean([m["return"] for m in finished]),
        "env/episode_length": mean([m["length"] for m in finished]),
        "env/valid_action_ratio": mean([float(t.valid_action) for t in turns]),
        "env/invalid_output_examples": invalid_examples(turns),
        "env/errored_episodes": sum("error" in e.metrics for e in episodes),
        "env/turns": len(turns),
        "rollout/response_length": mean([len(t.response_ids) for t in turns]),
        "rollout/prompt_length": mean([len(t.prompt_ids) for t in turns]),
        "rollout/truncated_responses": sum(t.info.get("finish_reason") == "length" for t in turns),
        "rollout/engine_retries": sum(t.info.get("engine_retries", 0) for t in turns),
        "rollout/tool_call_parse_failures": sum(t.info.get("tool_call_parse_failed", False) for t in turns),
        **tool_metrics(turns),
        **task_success(finished_episodes),
    }


def task_success(finished: list[Episode]) -> dict[str, float]:
    """`env/<task>/success_rate` per task when the finished episodes span several (a multi-task run)."""
    by_task: dict[str, list[float]] = {}
    for e in finished:
        by_task.setdefault(e.task, []).append(e.metrics["success"])
    if len(by_task) < 2:
        return {}
    return {f"env/{task}/success_rate": mean(values) for task, values in sorted(by_task.items())}


def tool_metrics(turns) -> dict[str, float]:
    """Tool calls of agent-loop turns: how many, and how many failed (by kind); none for games."""
    calls = [call for t in turns for call in t.info.get("tool_calls", [])]
    if not calls:
        return {}
    errors = Counter(call["error"] for call in calls if call["error"] is not None)
    return {"rollout/tool_calls": len(calls), "rollout/tool_errors": sum(errors.values()),
            **{f"rollout/tool_errors/{kind}": n for kind, n in errors.items()}}


def invalid_examples(turns, limit: int = 3) -> list[str]:
    """Up to `limit` distinct invalid outputs (the text after ACTION:, or the start of the response)."""
    examples: list[str] = []
    for t in turns:
        text = t.info.get("invalid_output")
        if text is not None and text not in examples:
            examples.append(text[:80])
        if len(examples) == limit:
            break
    return examples


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
