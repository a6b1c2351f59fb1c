"""The hf engine's KV cache: transformers' DynamicCache whose layers grow in place.

transformers' DynamicLayer concatenates each layer's keys and values with the new columns at every forward
pass, so a decode step copies the whole cache once per layer: O(context) bytes moved per token (a quarter of
a 16-row SmolLM2 decode step at ~500 tokens of context on the development CPU, BENCHMARKS.md). A GrowingLayer
keeps them in buffers with room to spare along the sequence, grown geometrically: a step writes its columns in
place and the model attends over views of the filled part. Assigning a layer's keys or values, as the engine
does when rows leave, join or are compacted (engines/hf.py), stores the new tensor with room to grow.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_ROOM = 32   # columns of room at least, beyond the filled ones, when a buffer is (re)allocated


def room_for(columns: int) -> int:
    """A buffer's columns for `columns` filled ones: half as many again (at least MIN_ROOM) to grow into, so that
    n decode steps reallocate O(log n) times and the buffer is at most ~1.5x what it holds."""
    return columns + max(MIN_ROOM, columns // 2)


class GrowingLayer(DynamicLayer):
    """A DynamicLayer over buffers [batch, heads, capacity, dim]: `keys` and `values` are views of their first
    `length` columns."""

    def __init__(self, *args, **kwargs):
        self._buffers: dict[str, torch.Tensor | None] = {"keys": None, "values": None}
        self._length = 0
        super().__init__(*args, **kwargs)

    def _filled(self, kind: str) -> torch.Tensor | None:
        buffer = self._buffers[kind]
        return None if buffer is None else buffer[:, :, :self._length]

    def _store(self, kind: str, tensor: torch.Tensor | None) -> None:
        """`tensor` as the layer's keys or values; a 4-d one is copied into a buffer with room to grow (an empty
        or missing one, as transformers' lazy initialization sets, leaves no buffer)."""
        if tensor is None or tensor.dim() != 4:
            self._buffers[kind], self._length = None, 0
            return
        shape = list(tensor.shape)
        shape[2] = room_for(shape[2])
        buffer = tensor.new_empty(shape)
        buffer[:, :, :tensor.shape[2]] = tensor
        self._buffers[kind], self._length = buffer, tensor.shape[2]

    keys = property(lambda self: self._filled("keys"), lambda self, tensor: self._store("keys", tensor))
    values = property(lambda self: self._filled("values"), lambda self, tensor: self._store("values", tensor))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new columns after the filled ones (in place while there is room) and return the keys
        and values so far, as DynamicLayer.update returns them."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self._buffers["keys"] is None:
            self.keys, self.values = key_states, value_states
            return self.keys, self.values
        start, end = self._length, self._length + key_states.shape[2]
        for kind, new in (("keys", key_states), ("values", value_states)):
            buffer = self._buffers[kind]
            if end > buffer.shape[2]:
                shape = list(buffer.shape)
                shape[2] = room_for(end)
                grown = buffer.new_empty(shape)
                grown[:, :, :start] = buffer[:, :, :start]
                self._buffers[kind] = buffer = grown
            buffer[:, :, start:end] = new
        self._length = end
        return self.keys, self.values


LAYER = GrowingLayer   # the layer every new cache is made of (tests compare it with DynamicLayer)


def new_cache() -> DynamicCache:
    """An empty cache whose layers (created as the model's layers first write to it) are LAYER."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = LAYER
    return cache
