"""The critic's value at a turn's first response column is the value of that turn's prompt, the same
number `prompt_values` gives for a bootstrap prompt: GAE links a turn to V(next turn's column 0) and
bootstraps a cut episode from V(bootstrap prompt), so both must be V(state = the whole prompt)."""

import torch

from horizonrl.agents.agent import Agent
from horizonrl.agents.prompt import HistoryEntry, plan_text
from horizonrl.config import MicroBatchBudget
from horizonrl.envs.river import River
from horizonrl.learner.models import ValueModel, pad_token_id
from horizonrl.learner.scoring import prompt_values, score
from horizonrl.records import Episode, Turn
from horizonrl.samples.per_turn import per_turn
from horizonrl.samples.tensors import Rows

torch.set_num_threads(1)


def two_turn_episode(tokenizer) -> Episode:
    """Two river turns with real chat-template prompts (memory 1) and responses of different lengths."""
    env, agent = River(stones=3, max_steps=8), Agent(tokenizer, memory=1)
    observation, _ = env.reset(4)
    turns, history = [], []
    for think, action in [("the next stone is somewhere", "jump left"), ("go", "wait")]:
        prompt = agent.prompt_ids(env, history, observation)
        response = tokenizer.encode(plan_text(think, action), add_special_tokens=False) + [tokenizer.eos_token_id]
        next_observation, reward, terminated, truncated, _ = env.step(action)
        turns.append(Turn(prompt, response, None, reward, terminated, truncated))
        history.append(HistoryEntry(observation, plan_text(think, action), tuple(prompt), tuple(response)))
        observation = next_observation
    assert not turns[-1].terminated
    return Episode("e", "river", 4, turns=turns, bootstrap_prompt_ids=agent.prompt_ids(env, history, observation))


def test_value_at_each_turns_first_response_column_is_the_value_of_its_prompt(river_tiny):
    tokenizer, model = river_tiny
    pad_id = pad_token_id(tokenizer)
    critic = ValueModel.from_policy(model).eval()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        torch.nn.init.normal_(critic.value_head.weight, std=1.0)
        torch.nn.init.normal_(critic.value_head.bias, std=1.0)
    episode = two_turn_episode(tokenizer)
    prompts = [t.prompt_ids for t in episode.turns]
    assert len(prompts[0]) != len(prompts[1])                 # the rows are padded differently
    samples = per_turn([episode])
    data = Rows.of(samples, pad_id, torch.device("cpu"))
    budget = MicroBatchBudget(2)
    values = score(data, budget, critic=critic).values_old

    for row, prompt in enumerate(prompts):
        first = len(prompt)                                       # column of the first response token
        assert data.loss_mask[row, first] == 1 and data.loss_mask[row, first - 1] == 0
        expected = prompt_values(critic, [prompt], pad_id, budget, torch.device("cpu"))
        assert abs(float(expected[0])) > 1e-3                    # a non-zero head: a real comparison
        torch.testing.assert_close(values[row, first], expected[0], rtol=0, atol=1e-5)
    # the other response columns hold other states' values (ids[:t] grows), not the prompt's again
    assert not torch.isclose(values[0, len(prompts[0]) + 1], values[0, len(prompts[0])], atol=1e-5)
