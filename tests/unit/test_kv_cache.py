"""engines/kv_cache.py: a GrowingLayer holds what transformers' DynamicLayer holds, written in place."""

import torch
from transformers.cache_utils import DynamicLayer

from horizonrl.engines.kv_cache import MIN_ROOM, GrowingLayer, advance, new_cache, room_for, rows_for, static_writes


def columns(n, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(3, 2, n, 4, generator=generator), torch.randn(3, 2, n, 4, generator=generator)


def test_a_growing_layer_holds_what_a_dynamic_layer_holds_and_reallocates_rarely():
    growing, dynamic = GrowingLayer(), DynamicLayer()
    buffers = []     # the buffer after each write, when it moved (a freed buffer's address can come back later)
    for step, n in enumerate([17] + [1] * 200 + [9]):         # a prefill, 200 decode steps, a joined prompt
        keys, values = columns(n, step)
        got, expected = growing.update(keys, values), dynamic.update(keys, values)
        assert all(torch.equal(a, b) for a, b in zip(got, expected))
        if not buffers or buffers[-1] != growing._buffers["keys"].data_ptr():
            buffers.append(growing._buffers["keys"].data_ptr())
    assert growing.get_seq_length() == dynamic.get_seq_length() == 17 + 200 + 9
    # room_for: 17 -> 49, 50 -> 82, 83 -> 124, 125 -> 187, 188 -> 282: 5 buffers for 202 writes
    assert room_for(17) == 17 + MIN_ROOM and room_for(188) == 282 and len(buffers) == 5


def test_assigned_keys_and_values_are_stored_with_room_and_extend_in_place():
    layer = GrowingLayer()
    layer.update(*columns(5, 0))
    kept = [0, 2]                                             # rows leave, as engines/hf._select assigns them
    keys, values = layer.keys[kept], layer.values[kept]
    layer.keys, layer.values = keys, values
    assert torch.equal(layer.keys, keys) and layer._buffers["keys"].shape[2] == room_for(5)
    new_keys, new_values = columns(1, 1)
    got_keys, got_values = layer.update(new_keys[:2], new_values[:2])
    assert torch.equal(got_keys, torch.cat([keys, new_keys[:2]], dim=2))
    assert torch.equal(got_values, torch.cat([values, new_values[:2]], dim=2))


def test_assigned_keys_and_values_go_into_the_same_buffers_while_they_fit():
    layer = GrowingLayer()
    keys, values = (torch.cat(pair, dim=0) for pair in zip(columns(5, 0), columns(5, 1)))   # 6 rows, 5 columns
    layer.update(keys[:4], values[:4])                        # buffers of rows_for(4) = 4 rows, room_for(5) columns
    layer.update(keys[:4, :, :1].repeat(1, 1, MIN_ROOM, 1), values[:4, :, :1].repeat(1, 1, MIN_ROOM, 1))
    buffer = layer._buffers["keys"]
    assert buffer.shape[:3] == (4, 2, 5 + MIN_ROOM) == layer.keys.shape[:3]   # full: keys is the whole buffer
    assert [rows_for(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 4, 4, 8, 8, 16]
    expected_keys, expected_values = layer.keys[1:].clone(), layer.values[1:].clone()
    layer.keys, layer.values = layer.keys[1:], layer.values[1:]   # views of the buffers themselves, a row up
    assert layer._buffers["keys"] is buffer
    assert torch.equal(layer.keys, expected_keys) and torch.equal(layer.values, expected_values)
    layer.keys = keys                                         # 6 rows do not fit in 4
    assert layer._buffers["keys"].shape[:3] == (8, 2, room_for(5)) and torch.equal(layer.keys, keys)


def test_static_writes_put_one_column_on_every_buffer_row_and_advance_counts_it():
    cache = new_cache()
    cache.update(*columns(5, 0), 0)                           # 3 rows of 5 columns, in buffers of 4 rows
    layer = cache.layers[0]
    before_keys, before_values = layer.keys.clone(), layer.values.clone()
    generator = torch.Generator().manual_seed(1)
    new_keys, new_values = torch.randn(4, 2, 1, 4, generator=generator), torch.randn(4, 2, 1, 4, generator=generator)
    with static_writes(cache, torch.tensor([5])):
        got_keys, got_values = cache.update(new_keys, new_values, 0)
    assert got_keys is layer._buffers["keys"] and got_values is layer._buffers["values"]      # the whole buffers
    assert torch.equal(got_keys[:, :, 5:6], new_keys) and torch.equal(got_values[:, :, 5:6], new_values)
    assert layer.length == 5 and layer._column is None
    advance(cache)
    assert torch.equal(layer.keys, torch.cat([before_keys, new_keys[:3]], dim=2))
    assert torch.equal(layer.values, torch.cat([before_values, new_values[:3]], dim=2))
    assert not got_keys[:, :, 6:].any()                       # the room past the filled columns is zeros


def test_a_new_cache_makes_growing_layers():
    cache = new_cache()
    cache.update(*columns(4, 0), 1)
    assert [type(layer) for layer in cache.layers] == [GrowingLayer, GrowingLayer]
    assert cache.get_seq_length(1) == 4
