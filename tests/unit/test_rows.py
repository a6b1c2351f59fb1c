"""Rows (samples/tensors.py): the typed training batch. `select` takes rows trimmed to the longest of them, `empty`
is the no-op micro-batch of the same fields, and a field that is None stays None in both."""

import dataclasses

import pytest
import torch

from horizonrl.records import SampleBatch
from horizonrl.samples.tensors import Rows


def rows() -> Rows:
    """Three rows of 2, 4 and 3 tokens (pad id 9), the last token of each sampled, advantages 1, 2, 3 on it."""
    batch = SampleBatch(input_ids=[[1, 2], [3, 4, 5, 6], [7, 8, 1]],
                        loss_mask=[[0, 1], [0, 0, 0, 1], [0, 0, 1]], segments=[], bootstrap_prompts=[])
    data = Rows.of(batch, pad_id=9)
    return dataclasses.replace(data, advantages=data.loss_mask * torch.tensor([[1.0], [2.0], [3.0]]))


def test_rows_of_samples_are_right_padded():
    data = rows()
    assert data.input_ids.tolist() == [[1, 2, 9, 9], [3, 4, 5, 6], [7, 8, 1, 9]]
    assert data.attention_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]]
    assert data.input_ids.dtype == data.attention_mask.dtype == torch.long and data.loss_mask.dtype == torch.float32
    assert len(data) == 3 and set(data.tensors()) == {"input_ids", "attention_mask", "loss_mask", "advantages"}


def test_select_takes_the_rows_in_their_order_trimmed_to_the_longest():
    picked = rows().select([2, 0])
    assert picked.input_ids.tolist() == [[7, 8, 1], [1, 2, 9]]          # 3 wide: the longer of rows 2 and 0
    assert picked.advantages.tolist() == [[0.0, 0.0, 3.0], [0.0, 1.0, 0.0]]
    assert picked.logp_old is None and picked.values_old is None


def test_empty_is_one_row_of_two_tokens_the_second_sampled_every_value_zero():
    empty = rows().empty()
    assert set(empty.tensors()) == set(rows().tensors())
    assert empty.attention_mask.tolist() == [[1, 1]] and empty.loss_mask.tolist() == [[0.0, 1.0]]
    assert empty.input_ids.tolist() == [[0, 0]] and empty.advantages.tolist() == [[0.0, 0.0]]
    assert empty.advantages.dtype == torch.float32 and empty.input_ids.dtype == torch.long


def test_rows_are_set_by_replacing_not_in_place():
    with pytest.raises(dataclasses.FrozenInstanceError):
        rows().logp_old = torch.zeros(3, 4)
