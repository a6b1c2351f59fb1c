"""A model's policy in an OpenSpiel game at every information state, and its exploitability (computed by OpenSpiel).

    {"game": "kuhn_poker", "policy": {"<information_state_string>": {"<action id>": probability}}, ...}

For each information state of each player (OpenSpiel's `TabularPolicy` lists them: Kuhn poker's 12, Leduc's 936)
the env stands at a state of it (`OpenSpielEnv.stand_at`), the agent builds the prompt from its observation alone
(no history: the observation spells out the moves so far, so `agent.memory` must be 0 for the table to be the
policy that plays), and the model scores each legal move's response teacher-forced, as the warm start writes it
(`plan_text(expert_reason, move)` and EOS, engines/scripted.py): p(move) is p(its response) normalised over the
legal moves, the log-probs at `temperature` (the run's sampling one). What this simplifies: a model that writes
other reasoning before its ACTION spreads probability over responses the table does not score. `coverage` says how
much: the mean over information states of the summed probability of the scored responses (1: the model answers
only in the warm start's words, and the table is its policy; lower: the table is its policy given those words).

`exploitability(table)`: OpenSpiel's `exploitability.exploitability` of the table, for the games it scores exactly
here in seconds (`EXACT`); Kuhn poker's uniform policy scores 0.458333, Leduc's 2.373611.
"""

from __future__ import annotations

import math

from horizonrl import envs
from horizonrl.agents.prompt import plan_text
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.scripted import scripted_generation
from horizonrl.learner.scoring import response_logprobs

EXACT = ("kuhn_poker", "leduc_poker")      # games whose exploitability OpenSpiel computes here in seconds
ROWS_PER_PASS = 64


def scored_game(env_id: str) -> str | None:
    """The OpenSpiel game of `env_id` when its exploitability is computed exactly here (EXACT), else None."""
    game = env_id.removeprefix("openspiel:")
    return game if env_id.startswith("openspiel:") and game in EXACT else None


def policy_table(model, tokenizer, agent, game: str, temperature: float = 1.0) -> tuple[dict, float]:
    """(the table of the module docstring, its coverage) of `model` (a causal LM) prompted by `agent`."""
    from open_spiel.python.policy import TabularPolicy

    env = envs.make(f"openspiel:{game}")
    stop = SamplingParams(stop_patterns=agent.stop_patterns)
    rows = []                                   # (information state, action id, prompt ids, response ids)
    for state in TabularPolicy(env.game).states:
        env.stand_at(state)
        prompt = agent.prompt_ids(env, [], env.render())
        for action in state.legal_actions():
            response = scripted_generation(tokenizer, plan_text(env.expert_reason(), env.actions[action]), stop)
            rows.append((state.information_state_string(), action, prompt, response.token_ids))
    scored = [(prompt, response) for _, _, prompt, response in rows]
    logps = [sum(tokens) for begin in range(0, len(scored), ROWS_PER_PASS)
             for tokens in response_logprobs(model, scored[begin:begin + ROWS_PER_PASS], temperature)]
    by_state: dict[str, dict[int, float]] = {}
    for (information, action, _, _), logp in zip(rows, logps, strict=True):
        by_state.setdefault(information, {})[action] = logp
    policy, covered = {}, []
    for information, scores in by_state.items():
        top = max(scores.values())
        weights = {action: math.exp(logp - top) for action, logp in scores.items()}
        total = sum(weights.values())
        policy[information] = {str(action): weight / total for action, weight in weights.items()}
        covered.append(math.exp(top) * total)
    return {"game": game, "temperature": temperature, "policy": policy}, sum(covered) / len(covered)


def exploitability(table: dict) -> float:
    """OpenSpiel's exploitability of `table` (a game of EXACT; every information state of it in the table)."""
    import pyspiel
    from open_spiel.python.algorithms import exploitability as scoring
    from open_spiel.python.policy import TabularPolicy

    game = pyspiel.load_game(table["game"])
    tabular = TabularPolicy(game)
    missing = sorted(set(tabular.state_lookup) - set(table["policy"]))
    if missing:
        raise ValueError(f"the policy table of {table['game']} lacks {len(missing)} information states, e.g. "
                         f"{missing[0]!r}")
    for information, probabilities in table["policy"].items():
        row = tabular.action_probability_array[tabular.state_lookup[information]]
        row[:] = 0.0
        for action, probability in probabilities.items():
            row[int(action)] = probability
    return float(scoring.exploitability(game, tabular))
