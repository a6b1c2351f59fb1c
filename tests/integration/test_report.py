"""report.html of a real tiny training run, rendered by headless Chromium: every curve is drawn and the
trajectory viewer shows turns with sampled and prompt tokens, action, reward and advantage."""

import re
import shutil
import subprocess

import pytest

from horizonrl.cli import main
from horizonrl.config import SOURCE_CONFIGS, load_config
from horizonrl.report.html import PLOTS
from horizonrl.report.metrics import read_metrics
from horizonrl.train.loop import train

TOY = str(SOURCE_CONFIGS / "toy.yaml")   # the river recipe: small, fast runs

# River of 2 stones, episodes of at most 4 steps in 4-turn batches: every batch has finished episodes
# (the env curves have points).
SMALL = ["iterations=2", "rollout.n_env=2", "ppo.e_len=4", "env.kwargs.stones=2", "env.kwargs.max_steps=4",
         "optim.mini_batch_size=8", "optim.micro_batch_size=8", "critic.warmup_batches=1", "critic.warmup_iters=1",
         "model.warm_start.steps=20", "model.warm_start.iterations=1", "device=cpu"]


def chromium_dom(path, tmp_path) -> str:
    """The page's DOM after Chromium has loaded it (file://, no network)."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.skip("no chromium binary on PATH (CI installs the Debian chromium package in .ci/run)")
    result = subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu",
                             f"--user-data-dir={tmp_path / 'chromium'}", "--dump-dom", path.resolve().as_uri()],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_ppo_run_report_renders_curves_and_trajectories_in_chromium(tmp_path, capsys):
    run_dir = train(load_config(TOY, [*SMALL, f"output_dir={tmp_path / 'runs'}"]), progress=False)
    report = run_dir / "report.html"
    assert report.exists()                                     # written by the training run itself
    trajectories = read_metrics(run_dir / "trajectories.jsonl")
    assert [r["iteration"] for r in trajectories] == [0, 0, 1, 1, 2, 2]

    report.unlink()
    assert main(["view", str(run_dir)]) == 0
    assert capsys.readouterr().out.strip() == str(report) and report.exists()

    dom = chromium_dom(report, tmp_path)
    figures = dict(re.findall(r'<figure data-key="([^"]+)">(.*?)</figure>', dom, re.S))
    assert list(figures) == [key for _, key in PLOTS]
    for key, figure in figures.items():
        points = re.search(r'<polyline[^>]*points="([^"]*)"', figure)
        assert points and len(points.group(1).split()) >= 2, f"{key}: no curve"
        assert "<svg" in figure and "no data" not in figure

    turns = re.findall(r'<tr class="turn">(.*?)</tr>', dom, re.S)
    assert len(turns) == sum(len(r["turns"]) for r in trajectories)
    complete = [t for t in turns if 'class="tok m1"' in t and 'class="tok m0"' in t
                and re.search(r'<td class="action">[^<]+</td>', t)
                and re.search(r'<td class="reward">[+-]\d', t)
                and re.search(r'<td class="advantage">[+-]\d+\.\d{4}</td>', t)]
    assert complete, "no turn with sampled and prompt tokens, action, reward and advantage"


def test_group_run_report_has_no_value_loss_but_trajectories(tmp_path):
    run_dir = train(load_config(TOY, [
        "iterations=1", "algorithm=grpo", "group.n_tasks=2", "group.group_size=2", "group.max_turns=3",
        "rollout.n_env=4", "ppo.e_len=4", "optim.mini_batch_size=4", "optim.micro_batch_size=4",
        "model.warm_start.steps=20", "model.warm_start.iterations=1", "device=cpu", f"output_dir={tmp_path}"]),
        progress=False)
    page = (run_dir / "report.html").read_text()
    value_loss = page.split('<figure data-key="train/critic/value_loss">')[1].split("</figure>")[0]
    assert "no data" in value_loss and "<polyline" not in value_loss
    records = read_metrics(run_dir / "trajectories.jsonl")
    assert len(records) == 2 and all(t["advantage"] is not None for r in records for t in r["turns"])
    assert page.count('<tr class="turn">') == sum(len(r["turns"]) for r in records)


def test_view_of_a_folder_that_is_not_a_run_is_one_clear_error(tmp_path, capsys):
    assert main(["view", str(tmp_path)]) == 2
    assert "is not a run folder (no config.yaml)" in capsys.readouterr().err
