"""Expert demonstrations (BabyAI's bot, the BabaIsAI solver, Sokoban's search) and `horizonrl sft` on them."""

import copy
import json
import math
import random
import re

import pytest
import torch

from horizonrl import envs
from horizonrl.agents.agent import Agent
from horizonrl.cli import main
from horizonrl.config import SOURCE_CONFIGS, TinyModel
from horizonrl.envs.babyai import BabyAIEnv
from horizonrl.envs.sokoban import solve
from horizonrl.learner.models import pad_token_id
from horizonrl.learner.sft import supervised_finetune
from horizonrl.records import Episode, SampleBatch
from horizonrl.samples.per_turn import per_turn
from horizonrl.samples.tensors import Rows
from horizonrl.train.demonstrations import demonstration_rows, expert_episodes
from horizonrl.assembly.warm_start import build_tiny_for_envs

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def goto_tiny():
    """A BPE tokenizer trained on BabyAI goto's text and a random tiny Llama model for it."""
    tokenizer, model = build_tiny_for_envs([BabyAIEnv("goto")], TinyModel(), seed=0, device=torch.device("cpu"))
    return tokenizer, model.eval()


@pytest.fixture(scope="module")
def demos(goto_tiny):
    return expert_episodes(Agent(goto_tiny[0], memory=1), "babyai/goto", {}, episodes=2, max_turns=64, seed=0)


@pytest.mark.parametrize("task", ["goto", "pickup", "open", "pick_up_seq_go_to"])
def test_following_the_bot_solves_babyai_tasks(task):
    env = BabyAIEnv(task)
    for seed in range(5):
        env.reset(seed)
        for _ in range(env.max_steps):
            action, reason = env.expert_action()
            assert action in env.actions and reason
            _, reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
        assert terminated and info["success"] and reward == 1.0


@pytest.mark.parametrize("task", ["goto", "pickup"])
def test_the_bot_told_of_random_moves_and_turns_still_solves_babyai_tasks(task):
    """Advising mode: a third of the steps take a random other move or turn than the bot's, which the env tells
    the bot (replan(action_taken)); the bot plans from there and solves every episode. A bot not told of them
    (replan() alone) believes its own action was taken: on pickup it drops an object it never picked up (an
    assertion inside minigrid's bot)."""
    env, rng = BabyAIEnv(task, max_steps=64), random.Random(0)
    for seed in range(20):
        env.reset(seed)
        for _ in range(env.max_steps):
            action, _ = env.expert_action()
            if rng.random() < 1 / 3:
                action = rng.choice([other for other in env.expert_recovers_from() if other != action])
            _, reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
        assert terminated and info["success"], (task, seed)


def test_noisy_demonstrations_mask_their_deviations_and_learn_from_the_rest(goto_tiny):
    """sft.expert_noise=0.3: about 30% of the turns play a random other action than the bot's and are
    marked; their rows' loss masks are all zero, every other row keeps its response mask; supervised_finetune
    then draws only the rows with a mask. The same seed gives the same deviations; noise 0 none."""
    tokenizer, model = goto_tiny
    agent = Agent(tokenizer, memory=1)
    demos = expert_episodes(agent, "babyai/goto", {}, episodes=8, max_turns=64, seed=0, noise=0.3)
    turns = [turn for episode in demos for turn in episode.turns]
    deviated = [bool(turn.info.get("deviation")) for turn in turns]
    assert 0.15 < sum(deviated) / len(turns) < 0.45 and all(e.metrics["success"] for e in demos)
    again = expert_episodes(agent, "babyai/goto", {}, episodes=8, max_turns=64, seed=0, noise=0.3)
    assert [bool(t.info.get("deviation")) for e in again for t in e.turns] == deviated
    rows = demonstration_rows(demos)
    for mask, turn, deviation in zip(rows.loss_mask, turns, deviated):
        learned = [0] * len(turn.prompt_ids) + [1] * len(turn.response_ids)
        assert mask == [0] * len(mask) if deviation else mask == learned
    clean = expert_episodes(agent, "babyai/goto", {}, episodes=2, max_turns=64, seed=0)
    assert not any(turn.info.get("deviation") for episode in clean for turn in episode.turns)


def test_noisy_sokoban_demonstrations_deviate_only_where_the_room_stays_solvable(qwen_tokenizer):
    """Sokoban's deviations are moves that change the room and leave it solvable (expert_recovers_from()):
    replayed, each changes the player's or a box's cell and the room still has a solution; every noisy
    demonstration ends solved."""
    demos = expert_episodes(Agent(qwen_tokenizer), "sokoban/6x6-1box", {"max_steps": 60}, episodes=8, max_turns=60,
                            seed=0, noise=0.3)
    turns = [turn for episode in demos for turn in episode.turns]
    assert 0.1 < sum(bool(turn.info.get("deviation")) for turn in turns) / len(turns) < 0.45
    assert all(episode.metrics["success"] for episode in demos)
    env = envs.make("sokoban/6x6-1box", max_steps=60)
    for episode in demos:
        env.reset(episode.seed)
        for turn in episode.turns:
            before = (env.player, env.box_cells)
            env.step(turn.action)
            if turn.info.get("deviation"):
                assert (env.player, env.box_cells) != before
                assert solve(env.room.walls, env.room.targets, env.player, env.box_cells) is not None


def test_sft_draws_only_rows_with_a_loss_mask(goto_tiny, demos):
    """Row 0 has no mask (a deviation): were it drawn, its loss would be 0/0. Each of 4 one-row steps
    draws row 1, so the first loss is row 1's alone, the same as on a batch of row 1 only."""
    tokenizer, model = goto_tiny
    turn = demos[0].turns[0]
    ids = turn.prompt_ids + turn.response_ids
    mask = [0] * len(turn.prompt_ids) + [1] * len(turn.response_ids)
    masked = SampleBatch([ids, ids], [[0] * len(ids), mask], [], [])
    losses = supervised_finetune(copy.deepcopy(model), masked, pad_token_id(tokenizer), steps=4, batch_size=1, lr=1e-3)
    alone = supervised_finetune(copy.deepcopy(model), SampleBatch([ids], [mask], [], []), pad_token_id(tokenizer),
                                steps=4, batch_size=1, lr=1e-3)
    assert all(math.isfinite(loss) for loss in losses) and losses == pytest.approx(alone, rel=1e-5)
    with pytest.raises(ValueError, match="no rows to learn from"):
        supervised_finetune(model, SampleBatch([ids], [[0] * len(ids)], [], []), pad_token_id(tokenizer), steps=1,
                            batch_size=1, lr=1e-3)


@pytest.mark.parametrize("decay, factors", [
    ("constant", [1, 1, 1, 1]),
    ("cosine", [1, (1 + 0.5 ** 0.5) / 2, 0.5, (1 - 0.5 ** 0.5) / 2]),   # (1 + cos(pi (s - 1) / 4)) / 2 by hand
])
def test_sft_lr_decay_sets_each_steps_learning_rate(goto_tiny, demos, monkeypatch, decay, factors):
    tokenizer, model = goto_tiny
    seen = []
    adamw_step = torch.optim.AdamW.step

    def recording_step(optimizer, *args, **kwargs):
        seen.append(optimizer.param_groups[0]["lr"])
        return adamw_step(optimizer, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", recording_step)
    supervised_finetune(copy.deepcopy(model), per_turn(demos), pad_token_id(tokenizer), steps=4, batch_size=2,
                        lr=1e-3, lr_decay=decay)
    assert seen == pytest.approx([1e-3 * factor for factor in factors], rel=1e-9)


def test_expert_noise_on_an_expert_that_does_not_recover_is_refused(goto_tiny):
    with pytest.raises(ValueError, match="sft.expert_noise: the expert of env.id babaisai/goto_win-distr_obj "
                                         "does not say which actions it recovers from"):
        expert_episodes(Agent(goto_tiny[0]), "babaisai/goto_win-distr_obj", {}, episodes=1, max_turns=8, seed=0,
                        noise=0.1)


def test_expert_episodes_are_rendered_through_the_agents_own_prompts(goto_tiny):
    env = BabyAIEnv("goto")
    tokenizer, _ = goto_tiny
    agent = Agent(tokenizer, memory=1)
    demos: list[Episode] = expert_episodes(agent, "babyai/goto", {}, episodes=4, max_turns=64, seed=0)
    assert len(demos) == 4 and all(e.metrics["success"] for e in demos)
    for episode in demos:
        first = episode.turns[0]
        observation, _ = env.reset(episode.seed)
        assert first.prompt_ids == agent.prompt_ids(env, [], observation)   # exactly the agent's prompt
        for turn in episode.turns:
            text = tokenizer.decode(turn.response_ids, skip_special_tokens=True)
            assert turn.valid_action and text.startswith("THINK: ") and text.endswith(f"ACTION: {turn.action}")
            assert turn.response_logprobs is None   # no model sampled them


def test_babaisai_demonstrations_win_through_the_agents_format(goto_tiny):
    tokenizer, _ = goto_tiny
    demos = expert_episodes(Agent(tokenizer, memory=1), "babaisai/goto_win-distr_obj", {}, episodes=3, max_turns=32,
                            seed=0)
    assert [e.metrics["success"] for e in demos] == [True] * 3
    for turn in (turn for episode in demos for turn in episode.turns):
        text = tokenizer.decode(turn.response_ids, skip_special_tokens=True)
        assert turn.valid_action and turn.action in ("up", "right", "down", "left")
        assert text.startswith("THINK: reach the ") and text.endswith(f"ACTION: {turn.action}")


def test_an_env_without_an_expert_is_refused_with_one_message(goto_tiny):
    tokenizer, _ = goto_tiny
    with pytest.raises(ValueError, match="river has no expert"):
        expert_episodes(Agent(tokenizer), "river", {}, episodes=1, max_turns=8, seed=0)


def test_sft_rows_of_demonstrations_carry_loss_on_the_response_ids_only(goto_tiny, demos):
    tokenizer, _ = goto_tiny
    turns = [turn for episode in demos for turn in episode.turns]
    data = Rows.of(per_turn(demos), pad_token_id(tokenizer), torch.device("cpu"))
    assert len(turns) == len(data.input_ids) > 2
    width = data.input_ids.shape[1]
    for row, turn in enumerate(turns):
        p, n = len(turn.prompt_ids), len(turn.response_ids)
        assert p > 0 and n > 0
        # 0 on the prompt, 1 on the response, 0 on the padding after it
        assert data.loss_mask[row].tolist() == [0.0] * p + [1.0] * n + [0.0] * (width - p - n)
        assert data.input_ids[row, p:p + n].tolist() == turn.response_ids
        assert data.attention_mask[row].tolist() == [1] * (p + n) + [0] * (width - p - n)


def first_step(model, input_ids: list[int], loss_mask: list[int], pad_id: int):
    """supervised_finetune's loss before its one step on the one row, and the model after that step."""
    model = copy.deepcopy(model)
    (loss,) = supervised_finetune(model, SampleBatch([input_ids], [loss_mask], [], []), pad_id, steps=1,
                                  batch_size=1, lr=1e-3)
    return loss, model


def test_sft_loss_is_the_mean_negative_log_prob_of_the_masked_tokens_and_ignores_the_rest(goto_tiny, demos):
    """A row  prompt | response | tail  with mask 0 | 1 | 0 (a tail as in merged rows: ids after the
    response). The loss is -(1/n) sum over response tokens of log softmax(logits[t-1])[id_t], computed
    here from the model's full logits; the tail ids are targets of mask-0 positions and come after
    every response token, so changing them changes neither the loss nor the step; changing a response
    id changes the loss."""
    tokenizer, model = goto_tiny
    pad_id = pad_token_id(tokenizer)
    first, second = demos[0].turns[0], demos[0].turns[1]
    tail = second.prompt_ids[-5:]
    ids = first.prompt_ids + first.response_ids + tail
    mask = [0] * len(first.prompt_ids) + [1] * len(first.response_ids) + [0] * len(tail)
    loss, stepped = first_step(model, ids, mask, pad_id)

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    start, n = len(first.prompt_ids), len(first.response_ids)
    by_hand = -float(logp[start - 1:start - 1 + n].sum()) / n     # logits[t-1] predicts id t
    assert loss == pytest.approx(by_hand, abs=1e-5)

    other_tail = [(i + 7) % len(tokenizer) for i in tail]
    assert other_tail != tail
    other_loss, other_stepped = first_step(model, ids[:-len(tail)] + other_tail, mask, pad_id)
    assert other_loss == pytest.approx(loss, abs=1e-6)
    for (name, p), q in zip(stepped.named_parameters(), other_stepped.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-7, msg=name)

    other_response = list(ids)
    other_response[start + n - 1] = (other_response[start + n - 1] + 7) % len(tokenizer)
    assert abs(first_step(model, other_response, mask, pad_id)[0] - loss) > 1e-4


def test_sft_command_fits_the_demonstrations_and_saves_a_checkpoint(tmp_path):
    args = ["sft", "env.id=babyai/goto", "env.kwargs={}", "sft.episodes=16", "sft.steps=40", "sft.batch_size=16",
            "name=goto-sft", f"output_dir={tmp_path}"]
    assert main(args) == 0
    (run_dir,) = tmp_path.iterdir()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["phase"] == "demonstrations" and records[0]["env/success_rate"] == 1.0
    losses = [r["sft/loss"] for r in records[1:]]
    assert len(losses) == 40 and sum(losses[-5:]) < 0.5 * sum(losses[:5])
    assert (run_dir / "checkpoint" / "config.json").exists()


def test_sft_with_shared_prefixes_takes_the_plain_forwards_steps(tmp_path):
    """optim.shared_prefix: the rows of a step that share their system prompt run it once; the losses are the plain
    forward's up to summation order."""
    losses, shares = {}, {}
    for shared in (False, True):
        args = ["sft", "env.id=[babyai/goto, babyai/pickup]", "env.kwargs={}", "sft.episodes=3", "sft.steps=4",
                "sft.batch_size=8", f"optim.shared_prefix={str(shared).lower()}", f"name=shared-{shared}",
                f"output_dir={tmp_path}"]
        assert main(args) == 0
        (run_dir,) = tmp_path.glob(f"shared-{shared}-*")
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        losses[shared] = [r["sft/loss"] for r in records[1:]]
        shares[shared] = records[0].get("perf/shared_prefix_share")
    assert shares[False] is None and shares[True] > 0.05, shares
    assert losses[True] == pytest.approx(losses[False], rel=1e-4)
    assert len(set(losses[True])) == 4


def test_sft_on_several_env_ids_demonstrates_each(tmp_path):
    args = ["sft", "env.id=[babyai/goto, babyai/pickup]", "env.kwargs={}", "sft.episodes=3", "sft.steps=2",
            "name=two-tasks", f"output_dir={tmp_path}"]
    assert main(args) == 0
    (run_dir,) = tmp_path.iterdir()
    demonstrations = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert demonstrations["env/episodes"] == 6
    assert demonstrations["env/babyai/goto/success_rate"] == demonstrations["env/babyai/pickup/success_rate"] == 1.0


def test_sft_on_an_env_without_an_expert_is_one_config_error_naming_env_id(tmp_path, capsys):
    """The toy recipe's env, river, has no expert: zero demonstrations. Before, a ValueError traceback."""
    args = ["sft", str(SOURCE_CONFIGS / "toy.yaml"), "sft.episodes=2", "sft.steps=2", f"output_dir={tmp_path}"]
    assert main(args) == 2
    error = capsys.readouterr().err
    assert ("horizonrl: config error:\nenv.id: river has no expert to demonstrate it (no expert_action()); "
            "docs/environments.md names the envs with one\n") in error and "Traceback" not in error
    assert not any(tmp_path.iterdir())


def test_sft_whose_expert_episodes_all_fail_is_one_error_naming_env_id_and_the_cause(tmp_path, capsys, monkeypatch):
    """Every env step fails, so each of the 2 expert episodes ends before its first turn: zero demonstrations.
    Before, supervised_finetune's ValueError ("no rows to learn from") ended the command in a traceback; now
    the CLI's RolloutsFailed path (exit 1) names env.id, sft.episodes and the env's error."""
    def broken_step(self, action):
        raise RuntimeError("the grid fell over")

    monkeypatch.setattr(BabyAIEnv, "step", broken_step)
    args = ["sft", "env.id=babyai/goto", "env.kwargs={}", "sft.episodes=2", "sft.steps=2", f"output_dir={tmp_path}"]
    assert main(args) == 1
    error = capsys.readouterr().err
    assert ("horizonrl: every expert episode of env.id babyai/goto (sft.episodes=2 each) failed (2 of 2), so sft "
            "has no demonstration to learn from; nothing was saved; the failures, most common first:\n") in error
    assert "raised RuntimeError: the grid fell over" in error and "Traceback" not in error
    assert not any(tmp_path.iterdir())


def test_sft_on_no_rows_is_one_clear_error_and_a_check_can_stop_it_between_steps(goto_tiny):
    """Before, zero rows failed inside torch.randint ("random_ expects 'from' to be less than 'to'")."""
    tokenizer, model = goto_tiny
    with pytest.raises(ValueError, match=r"no rows to learn from \(3 steps asked\)"):
        supervised_finetune(model, SampleBatch([], [], [], []), pad_token_id(tokenizer), steps=3, batch_size=2, lr=1e-3)
    steps = []

    def check() -> None:
        if len(steps) == 2:
            raise KeyboardInterrupt
        steps.append(None)

    with pytest.raises(KeyboardInterrupt):
        supervised_finetune(copy.deepcopy(model), SampleBatch([[5, 6, 7]], [[0, 1, 1]], [], []),
                            pad_token_id(tokenizer), steps=5, batch_size=1, lr=1e-3, check=check)
    assert len(steps) == 2                                    # checked before each step: 2 steps ran


def test_sft_logs_its_loss_every_tenth_of_the_run(goto_tiny, caplog):
    """A real model's warm start runs for minutes: without these lines `horizonrl sft` printed nothing
    between the demonstrations and the run folder."""
    tokenizer, model = goto_tiny
    with caplog.at_level("INFO", logger="horizonrl.learner.sft"):
        losses = supervised_finetune(copy.deepcopy(model), SampleBatch([[5, 6, 7]], [[0, 1, 1]], [], []),
                                     pad_token_id(tokenizer), steps=25, batch_size=1, lr=1e-3)
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(":")[0] for line in lines] == [f"sft step {s}/25" for s in (2, 4, 6, 8, 10, 12, 14, 16, 18,
                                                                                   20, 22, 24, 25)]
    assert lines[-1].startswith(f"sft step 25/25: loss {losses[-1]:.4f}, ")


@pytest.mark.parametrize("quiet", [False, True])
def test_sft_command_shows_a_progress_bar_over_its_steps_unless_quiet(tmp_path, capsys, quiet):
    """Before, `horizonrl sft` showed no bar (and took no --quiet): a real model's warm start sat silent for minutes
    between its log lines. The bar, named after the run, counts the sft.steps optimizer steps to 3/3 and shows the
    last loss, the one metrics.jsonl records for step 3; --quiet prints no bar."""
    args = ["sft", "env.id=babyai/goto", "env.kwargs={}", "sft.episodes=2", "sft.steps=3", "sft.batch_size=2",
            "name=goto-bar", f"output_dir={tmp_path}", *(["--quiet"] if quiet else [])]
    assert main(args) == 0
    error = capsys.readouterr().err
    (run_dir,) = tmp_path.iterdir()
    last_loss = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["sft/loss"]
    if quiet:
        assert "goto-bar" not in error and "%|" not in error, error
    else:
        states = [line for line in re.split(r"[\r\n]", error) if line.startswith("goto-bar:")]  # redrawn in place
        final = states[-1]
        assert final.startswith("goto-bar: 100%|") and " 3/3 [" in final, error
        assert f"loss={last_loss:.4f}]" in final, error
