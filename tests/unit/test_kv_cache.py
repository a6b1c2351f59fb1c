"""engines/kv_cache.py: a GrowingLayer holds what transformers' DynamicLayer holds, written in place."""

import torch
from transformers.cache_utils import DynamicLayer

from horizonrl.engines.kv_cache import MIN_ROOM, GrowingLayer, new_cache, room_for


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


def test_a_new_cache_makes_growing_layers():
    cache = new_cache()
    cache.update(*columns(4, 0), 1)
    assert [type(layer) for layer in cache.layers] == [GrowingLayer, GrowingLayer]
    assert cache.get_seq_length(1) == 4
