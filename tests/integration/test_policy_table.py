"""A model's policy over every information state of an OpenSpiel poker game, and its exploitability
(src/horizonrl/policy_table.py, `horizonrl eval --policy-table`)."""

import json

import pytest
import torch

pyspiel = pytest.importorskip("pyspiel", reason="the games extra is not installed: pip install -e '.[games]'")

from horizonrl.policy_table import exploitability, policy_table  # noqa: E402


def uniform_table(game: str) -> dict:
    from open_spiel.python.policy import TabularPolicy

    tabular = TabularPolicy(pyspiel.load_game(game))
    return {"game": game, "policy": {state.information_state_string(): {str(a): 1 / len(state.legal_actions())
                                                                        for a in state.legal_actions()}
                                     for state in tabular.states}}


def test_exploitability_is_openspiels_for_the_uniform_and_the_equilibrium_policies():
    """OpenSpiel's own numbers: Kuhn's uniform policy 0.458333, Leduc's 2.373611; Kuhn's equilibrium 0."""
    assert exploitability(uniform_table("kuhn_poker")) == pytest.approx(0.458333, abs=1e-6)
    assert exploitability(uniform_table("leduc_poker")) == pytest.approx(2.373611, abs=1e-6)
    optimal = pyspiel.kuhn_poker.get_optimal_policy(0.0).policy_table()
    table = {"game": "kuhn_poker", "policy": {state: {str(a): p for a, p in moves} for state, moves in optimal.items()}}
    assert exploitability(table) == pytest.approx(0.0, abs=1e-9)
    del table["policy"]["1pb"]
    with pytest.raises(ValueError, match="lacks 1 information states, e.g. '1pb'"):
        exploitability(table)


def test_the_table_is_the_models_own_probability_of_each_legal_moves_response():
    """At Kuhn's state '1b' (a Queen, facing a bet): p(pass) / (p(pass) + p(bet)) from the model's full logits
    (log-softmax, gathered at the response tokens), the table's number through the scored path."""
    from horizonrl import envs
    from horizonrl.agents.agent import Agent
    from horizonrl.agents.prompt import plan_text
    from horizonrl.assembly.warm_start import build_tiny_for_envs
    from horizonrl.config import TinyModel

    env = envs.make("openspiel:kuhn_poker")
    tokenizer, model = build_tiny_for_envs([env], TinyModel(), seed=3, device=torch.device("cpu"))
    agent = Agent(tokenizer, memory=0)
    table, coverage = policy_table(model.eval(), tokenizer, agent, "kuhn_poker", temperature=0.7)
    state = pyspiel.load_game("kuhn_poker").new_initial_state()
    for action in (0, 1, 1):                  # Jack to player 1, Queen to player 2; player 1 bets
        state.apply_action(action)
    env.stand_at(state)
    prompt = agent.prompt_ids(env, [], env.render())
    logps = []
    for move in ("pass", "bet"):
        response = tokenizer.encode(plan_text(env.expert_reason(), move), add_special_tokens=False) \
            + [tokenizer.eos_token_id]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1] / 0.7
        logps.append(float(torch.log_softmax(logits.double(), -1).gather(1, torch.tensor(response)[:, None]).sum()))
    expected = 1 / (1 + torch.tensor(logps[1] - logps[0]).exp().item())
    assert set(table["policy"]) == {"0", "1", "2", "0p", "1p", "2p", "0b", "1b", "2b", "0pb", "1pb", "2pb"}
    assert table["policy"]["1b"]["0"] == pytest.approx(expected, rel=1e-4)
    assert 0.0 < coverage <= 1.0


def test_eval_writes_the_table_and_the_exploitability_of_a_format_only_warm_start(tmp_path, capsys):
    from horizonrl.cli import main
    from horizonrl.config import SOURCE_CONFIGS

    assert main(["sft", str(SOURCE_CONFIGS / "kuhn_tiny_sft.yaml"), "sft.steps=20", "sft.episodes=32",
                 f"output_dir={tmp_path}", "--quiet"]) == 0
    (run,) = tmp_path.iterdir()
    table_file = tmp_path / "table.json"
    assert main(["eval", str(run), "--episodes", "4", "--mode", "greedy", "--policy-table", str(table_file)]) == 0
    assert "kuhn_poker: exploitability" in capsys.readouterr().out
    results = json.loads((run / "eval-checkpoint.json").read_text())
    scored = results["games"]["kuhn_poker"]
    table = json.loads(table_file.read_text())
    assert scored["information_states"] == len(table["policy"]) == 12
    assert scored["exploitability"] == pytest.approx(exploitability(table))
    assert main(["eval", str(run), "--episodes", "2", "--mode", "greedy", "--env", "river",
                 "--policy-table", str(table_file)]) == 2
    assert "--policy-table writes the table of one game" in capsys.readouterr().err
