"""runs/<name>/report.html: one self-contained page (inline CSS and SVG, no script, nothing fetched
from the network) with the run's curves, from metrics.jsonl, and its sample trajectories, from
trajectories.jsonl (report/trajectories.py).

Curves. x is each record's `iteration`. Episode statistics (`env/*`) are plotted for every record, so
iteration 0 of a PPO run (the critic warmup: episodes of the untrained policy) is the first point.
Training statistics (`train/*`) only for records of the training phase (`phase` == the run's
algorithm): a warmup record's `train/critic/*` average critic-only passes, not one iteration. A value
logged as null (no episode finished) is left out; a metric the run never logs (value loss without a
critic) gives a plot that says "no data". A run with validation (validation.jsonl, train/validation.py) adds its
greedy success and, for a poker game OpenSpiel scores, the policy's exploitability at each validation.

Trajectories. Every sampled episode of at most `MAX_ITERATIONS` iterations, evenly spaced with the
first and the last included, in collapsible <details> (the last iteration open); each turn shows its
tokens coloured by loss mask (`span.tok.m1` sampled by the policy, `span.tok.m0` prompt/observation),
the action, the reward and the turn's mean advantage.
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path

import yaml

from horizonrl import runfolder
from horizonrl.report.metrics import read_metrics
from horizonrl.report.plots import line_plot
from horizonrl.report.trajectories import evenly_spaced

PLOTS = [  # (title, metrics key)
    ("success rate", "env/success_rate"),
    ("episode return", "env/episode_return"),
    ("episode length (turns)", "env/episode_length"),
    ("KL to reference (k3, per token)", "train/kl_ref"),
    ("policy KL per update (approx)", "train/actor/approx_kl"),
    ("entropy (per token)", "train/actor/entropy"),
    ("value loss", "train/critic/value_loss"),
]
MAX_ITERATIONS = 12

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:20px} h2{font-size:17px;margin-top:28px}
.plots{display:flex;flex-wrap:wrap;gap:12px}
figure{margin:0;border:1px solid #ddd;border-radius:6px;padding:4px}
svg .title{font-size:13px;font-weight:600} svg .label,svg .nodata{font-size:11px;fill:#555}
svg .axis{fill:none;stroke:#888} svg .line{fill:none;stroke:#1f6feb;stroke-width:2} svg .last{fill:#1f6feb}
details{margin:4px 0 4px 12px} summary{cursor:pointer}
table.turns{border-collapse:collapse;margin:6px 0} table.turns td,table.turns th{border:1px solid #ddd;
padding:4px 6px;vertical-align:top;text-align:left} td.tokens{font:12px/1.5 ui-monospace,monospace;
white-space:pre-wrap;word-break:break-all;max-width:820px}
.tok{border-right:1px solid rgba(0,0,0,.12)} .m1{background:#c8f0c8} .m0{background:#e8e8f4;color:#555}
.cut{color:#999;font-style:italic}
"""


def series(records: list[dict], key: str, algorithm: str) -> tuple[list[float], list[float]]:
    """(iterations, values) of `key`, by the rule in the module docstring, in iteration order."""
    points = sorted((r["iteration"], float(r[key])) for r in records
                    if _is_number(r.get(key)) and (key.startswith("env/") or r.get("phase") == algorithm))
    return [x for x, _ in points], [y for _, y in points]


def task_plots(metrics: list[dict]) -> list[tuple[str, str]]:
    """(title, key) of the per-task success rates of a multi-task run (report/metrics.task_success)."""
    rates = {k for r in metrics for k in r if k.startswith("env/") and k.endswith("/success_rate")}
    keys = sorted(rates - {PLOTS[0][1]})
    return [(f"success rate: {key.removeprefix('env/').removesuffix('/success_rate')}", key) for key in keys]


def validation_figures(validations: list[dict]) -> str:
    """The validation curves (module docstring): none for a run without validation."""
    if not validations:
        return ""
    iterations = [line["iteration"] for line in validations]
    curves = [("validation: greedy success", [line["success_rate"] for line in validations])]
    scored = [line.get("exploitability", {}) for line in validations]     # lines of older runs have none
    for game in dict.fromkeys(game for games in scored for game in games):
        curves.append((f"validation: exploitability ({game})", [games.get(game) for games in scored]))
    figures = []
    for title, values in curves:
        points = [(x, y) for x, y in zip(iterations, values) if _is_number(y)]
        figures.append(f'<figure data-key="validation/{escape(title)}">'
                       f'{line_plot([x for x, _ in points], [y for _, y in points], title)}</figure>')
    return "".join(figures)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def render_report(name: str, algorithm: str, metrics: list[dict], trajectories: list[dict], config_text: str,
                  validations: list[dict] = ()) -> str:
    """The whole page as a string."""
    figures = "".join(f'<figure data-key="{escape(key)}">{line_plot(*series(metrics, key, algorithm), title)}</figure>'
                      for title, key in PLOTS + task_plots(metrics)) + validation_figures(list(validations))
    warmup = any(r.get("phase") == "critic_warmup" for r in metrics)
    note = " Iteration 0 is the critic warmup (episodes of the untrained policy)." if warmup else ""
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(name)}</title>'
            f'<style>{STYLE}</style></head><body><h1>{escape(name)}</h1>'
            f'<p>{algorithm} · {sum(r.get("phase") == algorithm for r in metrics)} training iterations.{note}</p>'
            f'<details><summary>config.yaml</summary><pre>{escape(config_text)}</pre></details>'
            f'<h2>Curves</h2><div class="plots">{figures}</div>'
            f'<h2>Sample trajectories</h2>{trajectory_viewer(trajectories)}</body></html>')


def trajectory_viewer(records: list[dict]) -> str:
    """The sampled episodes grouped by iteration (see the module docstring)."""
    if not records:
        return '<p class="nodata">no trajectories</p>'
    sampled = sorted({r["iteration"] for r in records})
    iterations = evenly_spaced(sampled, MAX_ITERATIONS)
    legend = ('<p><span class="tok m1">sampled by the policy (mask 1)</span> '
              '<span class="tok m0">prompt, observation (mask 0)</span> · advantage: mean over the turn\'s '
              f'sampled tokens · showing {len(iterations)} of {len(sampled)} sampled iterations</p>')
    blocks = []
    for it in iterations:
        episodes = "".join(_episode(r) for r in records if r["iteration"] == it)
        is_last = " open" if it == iterations[-1] else ""
        blocks.append(f'<details class="iteration"{is_last}><summary>iteration {it}</summary>{episodes}</details>')
    return f'<div id="trajectories">{legend}{"".join(blocks)}</div>'


def _episode(record: dict) -> str:
    facts = [escape(str(record["episode_id"])), escape(str(record["task"])), f'seed {record["seed"]}',
             f'{len(record["turns"])} turns']
    if record["return"] is not None:
        facts.append(f'return {record["return"]:.3g}')
    if record["success"] is not None:
        facts.append("success" if record["success"] else "failure")
    if record["outcome_reward"] is not None:
        facts.append(f'outcome reward {record["outcome_reward"]:.3g}')
    if not record["finished"]:
        facts.append("continues in the next batch")
    rows = "".join(_turn(k, turn) for k, turn in enumerate(record["turns"]))
    return (f'<details class="episode"><summary>{" · ".join(facts)}</summary><table class="turns">'
            f'<tr><th>turn</th><th>tokens</th><th>action</th><th>reward</th><th>advantage</th></tr>{rows}</table>'
            '</details>')


def _turn(k: int, turn: dict) -> str:
    tokens = "".join(f'<span class="tok m{m}">{escape(_visible(t))}</span>'
                     for t, m in zip(turn["tokens"], turn["mask"]))
    if turn["context_cut"]:
        tokens = f'<span class="cut">[{turn["context_cut"]} earlier prompt tokens]</span>' + tokens
    if turn["response_cut"]:
        tokens += f'<span class="cut">[{turn["response_cut"]} more response tokens]</span>'
    action = escape(str(turn["action"])) + ("" if turn["valid_action"] else " (invalid output)")
    end = " (terminated)" if turn["terminated"] else " (truncated)" if turn["truncated"] else ""
    advantage = "n/a" if turn["advantage"] is None else f'{turn["advantage"]:+.4f}'
    return (f'<tr class="turn"><td>{k}</td><td class="tokens">{tokens}</td><td class="action">{action}</td>'
            f'<td class="reward">{turn["reward"]:+.3g}{end}</td><td class="advantage">{advantage}</td></tr>')


def _visible(token: str) -> str:
    """Newlines shown as a return sign (and kept), other control characters as \\xNN."""
    return "".join("\u21b5\n" if c == "\n" else c if c.isprintable() or c == "\t" else f"\\x{ord(c):02x}"
                   for c in token)


def write_report(run_dir: Path) -> Path:
    """(Re)write run_dir/report.html from run_dir's config.yaml, metrics.jsonl and trajectories.jsonl
    (absent: no curves, no trajectories); returns its path."""
    run_dir = Path(run_dir)
    config_text = (run_dir / runfolder.CONFIG).read_text()
    algorithm = yaml.safe_load(config_text).get("algorithm", "ppo")
    metrics, trajectories, validations = ([] if not (run_dir / f).exists() else read_metrics(run_dir / f)
                                          for f in (runfolder.METRICS, runfolder.TRAJECTORIES, runfolder.VALIDATIONS))
    path = run_dir / "report.html"
    path.write_text(render_report(run_dir.name, algorithm, metrics, trajectories, config_text, validations),
                    encoding="utf-8")
    return path
