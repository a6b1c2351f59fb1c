import pytest
import torch

from horizonrl.records import Episode, Turn
from horizonrl.samples import Rows, TurnIndex, per_turn


def turn(prompt, response, reward=0.0, terminated=False, truncated=False):
    return Turn(prompt, response, [-0.5] * len(response), reward, terminated, truncated)


def test_rows_masks_and_links():
    finished = Episode("a", "t", 0, turns=[turn([1, 2], [3]), turn([1, 2, 3, 4], [5, 6], 1.0, terminated=True)])
    cut = Episode("b", "t", 1, turns=[turn([7], [8, 9])], bootstrap_prompt_ids=[7, 8, 9, 10])
    truncated = Episode("c", "t", 2, turns=[turn([11], [12], truncated=True)], bootstrap_prompt_ids=[11, 12, 13])
    batch = per_turn([finished, cut, truncated])
    assert batch.input_ids == [[1, 2, 3], [1, 2, 3, 4, 5, 6], [7, 8, 9], [11, 12]]
    assert batch.loss_mask == [[0, 0, 1], [0, 0, 0, 0, 1, 1], [0, 1, 1], [0, 1]]
    assert [(s.row, s.start, s.length) for s in batch.segments] == [(0, 2, 1), (1, 4, 2), (2, 1, 2), (3, 1, 1)]
    assert [s.next_segment for s in batch.segments] == [1, -1, -1, -1]
    assert [s.episode_end for s in batch.segments] == [False, True, False, False]
    assert [s.bootstrap for s in batch.segments] == [-1, -1, 0, 1]
    assert [s.reward for s in batch.segments] == [0.0, 1.0, 0.0, 0.0]
    assert batch.bootstrap_prompts == [[7, 8, 9, 10], [11, 12, 13]]


def test_every_sampled_id_has_mask_one_and_nothing_else():
    episodes = [Episode("a", "t", 0, turns=[turn([1, 2, 3], [4, 5]), turn([6], [7], terminated=True)])]
    batch = per_turn(episodes)
    sampled = [i for row, mask in zip(batch.input_ids, batch.loss_mask) for i, m in zip(row, mask) if m]
    assert sampled == [4, 5, 7]


def test_unfinished_fragment_without_bootstrap_prompt_is_an_error():
    with pytest.raises(ValueError, match="no bootstrap prompt"):
        per_turn([Episode("a", "t", 0, turns=[turn([1], [2])])])
    with pytest.raises(ValueError, match="empty response"):
        per_turn([Episode("a", "t", 0, turns=[turn([1], [], terminated=True)])])


def test_turn_index_round_trip():
    episodes = [Episode("a", "t", 0, turns=[turn([1, 2], [3]), turn([1, 2, 3, 4], [5, 6, 7], terminated=True)])]
    batch = per_turn(episodes)
    data = Rows.of(batch, pad_id=0)
    assert data.input_ids.tolist() == [[1, 2, 3, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7]]
    assert data.attention_mask.tolist() == [[1, 1, 1, 0, 0, 0, 0], [1] * 7]
    index = TurnIndex.of(batch)
    turns = index.to_turns(data.input_ids.float())
    assert turns.tolist() == [[3, 0, 0], [5, 6, 7]]
    assert index.mask.tolist() == [[1, 0, 0], [1, 1, 1]]
    rows = index.to_rows(turns, data.input_ids.shape)
    assert torch.equal(rows, data.input_ids.float() * data.loss_mask)
