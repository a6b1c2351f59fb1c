"""trajectory_records: per-turn tokens, masks, cuts and mean advantages on hand-built episodes, the same
whether the rows are per-turn or merged."""

import pytest
import torch

from horizonrl.records import Episode, Turn
from horizonrl.report.trajectories import evenly_spaced, trajectory_records
from horizonrl.samples import TurnIndex, merge_turns, per_turn


class Decoder:
    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=True):
        assert len(ids) == 1 and not skip_special_tokens and not clean_up_tokenization_spaces
        return f"t{ids[0]}"


def turn(prompt, response, reward=0.0, terminated=False, action="a"):
    return Turn(prompt, response, None, reward, terminated, action=action)


# Episode "a" keeps its history token-exact: prompt_1 = prompt_0 + response_0 + observation [5, 6].
EPISODES = [
    Episode("a", "river", 0, turns=[turn([1, 2], [3, 4], 0.5, action="left"),
                                    turn([1, 2, 3, 4, 5, 6], [7, 8, 9], 1.0, terminated=True, action="right")],
            metrics={"success": True, "return": 1.5, "length": 2}),
    Episode("b", "river", 1, turns=[turn([10], [11], terminated=True)], metrics={"success": False, "return": 0.0}),
]
TURN_ADVANTAGES = torch.tensor([[1.0, 3.0, 0.0], [-1.0, 0.0, 4.0], [2.0, 0.0, 0.0]])   # [turn, response token]


def records(samples, **caps):
    index = TurnIndex.of(samples)
    width = max(len(r) for r in samples.input_ids)
    advantages = index.to_rows(TURN_ADVANTAGES * index.mask, torch.Size([len(samples.input_ids), width]))
    return trajectory_records(7, EPISODES, samples, advantages, Decoder(), **caps)


def test_turns_show_new_context_then_response_with_their_masks_and_mean_advantage():
    a, b = records(per_turn(EPISODES))
    assert {k: a[k] for k in ("iteration", "episode_id", "task", "seed", "finished", "success", "return")} == {
        "iteration": 7, "episode_id": "a", "task": "river", "seed": 0, "finished": True, "success": True,
        "return": 1.5}
    first, second = a["turns"]
    assert first["tokens"] == ["t1", "t2", "t3", "t4"] and first["mask"] == [0, 0, 1, 1]
    assert second["tokens"] == ["t5", "t6", "t7", "t8", "t9"] and second["mask"] == [0, 0, 1, 1, 1]  # only the new obs
    assert (first["action"], first["reward"], first["advantage"]) == ("left", 0.5, 2.0)
    assert (second["action"], second["reward"], second["advantage"], second["terminated"]) == ("right", 1.0, 1.0, True)
    assert first["context_cut"] == first["response_cut"] == 0
    assert b["turns"][0]["advantage"] == 2.0 and b["success"] is False


def test_merged_rows_give_the_same_records():
    merged, report = merge_turns(EPISODES)
    assert report.merged == 1                        # episode a is one row: the mapping is not per row
    assert records(merged) == records(per_turn(EPISODES))


def test_caps_keep_the_last_context_and_first_response_tokens_advantage_over_all():
    a, _ = records(per_turn(EPISODES), context_tokens=1, response_tokens=2)
    second = a["turns"][1]
    assert second["tokens"] == ["t6", "t7", "t8"] and second["mask"] == [0, 1, 1]
    assert (second["context_cut"], second["response_cut"], second["advantage"]) == (1, 1, 1.0)


def test_sampled_episodes_are_evenly_spaced_and_segments_must_match():
    assert evenly_spaced(list(range(10)), 3) == [0, 4, 9] and evenly_spaced([1, 2], 5) == [1, 2]
    assert evenly_spaced(list(range(10)), 1) == [0]
    (only,) = records(per_turn(EPISODES), n_episodes=1)
    assert only["episode_id"] == "a"
    with pytest.raises(ValueError, match="3 turns in the episodes but 1 segments"):
        trajectory_records(0, EPISODES, per_turn(EPISODES[1:]), torch.zeros(1, 2), Decoder())
