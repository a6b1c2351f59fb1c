"""report.html from records: which records each curve uses, "no data" curves, escaped tokens."""

from horizonrl.report.html import PLOTS, render_report, series

METRICS = [
    {"iteration": 0, "phase": "critic_warmup", "env/success_rate": 0.1, "train/critic/value_loss": 9.0},
    {"iteration": 2, "phase": "ppo", "env/success_rate": None, "train/critic/value_loss": 0.5},
    {"iteration": 1, "phase": "ppo", "env/success_rate": 0.3, "train/critic/value_loss": 1.0},
]
TRAJECTORY = {"iteration": 1, "episode_id": "e<1>", "task": "river", "seed": 3, "finished": True, "success": True,
              "return": 1.0, "outcome_reward": None, "turns": [{
                  "tokens": ["<|im_end|>", "\n", "jump", "\x03"], "mask": [0, 0, 1, 1], "context_cut": 5,
                  "response_cut": 0, "action": "jump left", "valid_action": True, "reward": 1.0,
                  "advantage": -0.25, "terminated": True, "truncated": False}]}


def test_env_curves_include_the_warmup_record_train_curves_only_training_iterations():
    assert series(METRICS, "env/success_rate", "ppo") == ([0, 1], [0.1, 0.3])        # null left out
    assert series(METRICS, "train/critic/value_loss", "ppo") == ([1, 2], [1.0, 0.5])
    assert series(METRICS, "train/critic/value_loss", "grpo") == ([], [])


def test_page_has_every_curve_and_the_turn_with_escaped_tokens():
    page = render_report("run <x>", "ppo", METRICS, [TRAJECTORY], "algorithm: ppo\n")
    assert "<script" not in page and "<link" not in page and "<title>run &lt;x&gt;</title>" in page
    figures = page.split('<figure data-key="')[1:]
    assert [f.split('"')[0] for f in figures] == [key for _, key in PLOTS]
    drawn = [f.split('"')[0] for f in figures if "<polyline" in f]
    assert drawn == ["env/success_rate", "train/critic/value_loss"]
    assert sum("no data" in f for f in figures) == len(PLOTS) - 2
    assert "Iteration 0 is the critic warmup" in page
    assert ('<span class="tok m0">&lt;|im_end|&gt;</span><span class="tok m0">\u21b5\n</span>'
            '<span class="tok m1">jump</span><span class="tok m1">\\x03</span>') in page
    assert "[5 earlier prompt tokens]" in page and "e&lt;1&gt;" in page
    assert ('<td class="action">jump left</td><td class="reward">+1 (terminated)</td>'
            '<td class="advantage">-0.2500</td>') in page


def test_no_trajectories_and_no_metrics_still_make_a_page():
    page = render_report("empty", "grpo", [], [], "")
    assert page.count("no data") == len(PLOTS) and "no trajectories" in page


def test_validations_add_the_greedy_success_and_each_scored_games_exploitability():
    """Three validations; the last, of an older run's format, has no exploitability: its game curve has 2 points,
    at the y labels' extremes 0.47 and 0.2."""
    validations = [{"iteration": 0, "success_rate": 0.5, "exploitability": {"kuhn_poker": 0.47}},
                   {"iteration": 10, "success_rate": 0.25, "exploitability": {"kuhn_poker": 0.2}},
                   {"iteration": 20, "success_rate": 0.75}]
    page = render_report("run", "grpo", METRICS, [], "", validations)
    figures = dict(f.split('"', 1) for f in page.split('<figure data-key="')[1:])
    success, game = figures["validation/validation: greedy success"], \
        figures["validation/validation: exploitability (kuhn_poker)"]
    assert success.split('points="')[1].split('"')[0].count(",") == 3
    assert game.split('points="')[1].split('"')[0].count(",") == 2 and ">0.47<" in game and ">0.2<" in game
    assert "validation/" not in render_report("run", "grpo", METRICS, [], "")
