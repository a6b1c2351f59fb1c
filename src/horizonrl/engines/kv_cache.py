"""The hf engine's KV cache: transformers' DynamicCache whose layers are preallocated buffers written in place.

transformers' DynamicLayer concatenates each layer's keys and values with the new columns at every forward
pass, so a decode step copies the whole cache once per layer: O(context) bytes moved per token (a quarter of
a 16-row SmolLM2 decode step at ~500 tokens of context on the development CPU, BENCHMARKS.md). A GrowingLayer
keeps them in zeroed buffers [rows, heads, capacity, dim] with room to spare along both: a step writes its
columns in place and the model attends over views of the filled part. Assigning a layer's keys or values, as
the engine does when rows leave, join or are compacted (engines/hf.py), copies them into the same buffers
while they fit, and into new ones with room to grow when they do not.

The same buffers serve the fixed-shape decode step that engines/decode_graph.py replays as a CUDA graph: inside
`static_writes(cache, column)` every layer writes the step's keys and values at the device tensor `column` and
returns its whole buffers (the step's mask hides the columns past the filled ones), and `advance(cache)` then
counts the new column. Buffers stay where they are as long as their rows and columns fit, which is what lets a
captured graph replay on them step after step.
"""

from __future__ import annotations

import contextlib

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_ROOM = 32   # columns of room at least, beyond the filled ones, when a buffer is (re)allocated


def room_for(columns: int) -> int:
    """A buffer's columns for `columns` filled ones: half as many again (at least MIN_ROOM) to grow into, so that
    n decode steps reallocate O(log n) times and the buffer is at most ~1.5x what it holds."""
    return columns + max(MIN_ROOM, columns // 2)


def rows_for(rows: int) -> int:
    """A buffer's rows for `rows` filled ones: the next power of two, so that a batch whose rows come and go
    keeps its buffers and a decode graph captured for that many rows serves every smaller batch."""
    return 1 << max(rows - 1, 0).bit_length()


class GrowingLayer(DynamicLayer):
    """A DynamicLayer over zeroed buffers [rows_for(rows), heads, capacity, dim]: `keys` and `values` are views
    of their first `rows` rows and `length` columns."""

    def __init__(self, *args, **kwargs):
        self._buffers: dict[str, torch.Tensor | None] = {"keys": None, "values": None}
        self._rows = self._length = 0
        self._column: torch.Tensor | None = None   # set by static_writes: where a fixed-shape step writes
        super().__init__(*args, **kwargs)

    @property
    def buffers(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The whole (keys, values) buffers, None before the first write."""
        keys, values = self._buffers["keys"], self._buffers["values"]
        return None if keys is None or values is None else (keys, values)

    @property
    def length(self) -> int:
        return self._length

    def _filled(self, kind: str) -> torch.Tensor | None:
        buffer = self._buffers[kind]
        return None if buffer is None else buffer[:self._rows, :, :self._length]

    def _store(self, kind: str, tensor: torch.Tensor | None) -> None:
        """`tensor` as the layer's keys or values, copied into the buffer if it fits there, else into a new one
        with room to grow (an empty or missing tensor, as transformers' lazy initialization sets, leaves no
        buffer)."""
        if tensor is None or tensor.dim() != 4:
            self._buffers[kind], self._rows, self._length = None, 0, 0
            return
        rows, heads, columns, dim = tensor.shape
        buffer = self._buffers[kind]
        if (buffer is None or rows > buffer.shape[0] or columns > buffer.shape[2]
                or (heads, dim, tensor.dtype) != (buffer.shape[1], buffer.shape[3], buffer.dtype)):
            buffer = tensor.new_zeros((rows_for(rows), heads, room_for(columns), dim))
        elif tensor.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr():
            tensor = tensor.clone()   # a view of the buffer itself: copied out before it is overwritten
        buffer[:rows, :, :columns] = tensor
        self._buffers[kind], self._rows, self._length = buffer, rows, columns

    keys = property(lambda self: self._filled("keys"), lambda self, tensor: self._store("keys", tensor))
    values = property(lambda self: self._filled("values"), lambda self, tensor: self._store("values", tensor))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new columns after the filled ones (in place while there is room) and return the keys
        and values so far, as DynamicLayer.update returns them. Inside `static_writes`: write them at its
        column, on every row of the buffers, and return the whole buffers."""
        if self._column is not None:
            for kind, new in (("keys", key_states), ("values", value_states)):
                self._buffers[kind].index_copy_(2, self._column, new)
            return self._buffers["keys"], self._buffers["values"]
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self._buffers["keys"] is None:
            self.keys, self.values = key_states, value_states
            return self.keys, self.values
        start, end = self._length, self._length + key_states.shape[2]
        for kind, new in (("keys", key_states), ("values", value_states)):
            buffer = self._buffers[kind]
            if end > buffer.shape[2]:
                grown = buffer.new_zeros((buffer.shape[0], buffer.shape[1], room_for(end), buffer.shape[3]))
                grown[:, :, :start] = buffer[:, :, :start]
                self._buffers[kind] = buffer = grown
            buffer[:self._rows, :, start:end] = new
        self._length = end
        return self.keys, self.values


LAYER = GrowingLayer   # the layer every new cache is made of (tests compare it with DynamicLayer)


def new_cache() -> DynamicCache:
    """An empty cache whose layers (created as the model's layers first write to it) are LAYER."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = LAYER
    return cache


@contextlib.contextmanager
def static_writes(cache: DynamicCache, column: torch.Tensor):
    """Within: every layer of `cache` (all GrowingLayers with buffers) writes a forward pass's one new column
    at `column` (a one-element long tensor on the cache's device) on all its buffer rows, and returns its whole
    buffers, so that the pass's shapes and addresses do not depend on how much is filled."""
    for layer in cache.layers:
        layer._column = column
    try:
        yield
    finally:
        for layer in cache.layers:
            layer._column = None


def advance(cache: DynamicCache) -> None:
    """Count the column that a pass inside `static_writes` wrote."""
    for layer in cache.layers:
        layer._length += 1
