"""The hf engine's decode step at fixed shapes, which a CUDA graph can record once and replay.

Eagerly, a decode step launches a few dozen kernels per layer from Python: on an H100 a 16-row step of a 1.5B
model took 75-113 ms where reading its bf16 weights takes ~1 ms (issue 43). A CUDA graph records the step's
kernels once and replays them in one launch, but only on the same shapes and addresses. So the fixed-shape step
runs on
- the cache's own buffers (engines/kv_cache.py: [rows_for(rows), heads, capacity, dim], which stay where they
  are while the batch's rows and columns fit), all their rows (those past the batch's decode the pad token and
  are ignored), written at the device tensor `column` and attended over all `capacity` columns through a
  boolean mask [rows, 1, 1, capacity] that shows each row its filled columns and the new one;
- input tensors of its own (token ids, positions, mask, column) that each step fills before it runs.
One recording serves every step until the buffers move (rows past the bucket, a column past the capacity, a new
batch); the next step then records again. Transformers' forward reads nothing back from the device on this path
(it uses a 4-d mask as given, and the engine passes positions): tests/integration/test_engine.py records the step
on a CPU as a capture would (tests/graph_recorder.py) and replays it.

How a recording is made is chosen by name (CAPTURES, HFEngine's `decode_step`): "graph" captures a CUDA graph;
"static" reruns the fixed-shape step eagerly at every step (on a CPU: what a graph would replay, to check it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from horizonrl.engines import kv_cache

Step = Callable[[], torch.Tensor]   # one fixed-shape decode step: returns the logits [buffer rows, vocab]


def run_eagerly(step: Step) -> Step:
    """'static': the step itself, run anew at every call."""
    return step


def capture_cuda_graph(step: Step) -> Step:
    """'graph': `step` recorded as a CUDA graph after one eager run on a side stream (lazy initialisations such as
    cuBLAS workspaces must happen outside a capture); returns the replay, whose logits tensor is the same every
    time, overwritten by each replay. The warm-up run writes the step's cache column, as every replay does."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):   # the learner's thread may allocate meanwhile
        logits = step()

    def replay() -> torch.Tensor:
        graph.replay()
        return logits
    return replay


CAPTURES: dict[str, Callable[[Step], Step]] = {"static": run_eagerly, "graph": capture_cuda_graph}


class CaptureFailed(RuntimeError):
    """Recording the fixed-shape step failed: the engine decodes without it from then on."""


@dataclass(eq=False)
class _Recording:
    """A step over the cache buffers `buffers` (held, so that their memory cannot serve anything else while a
    replay may write it): the inputs it reads, which each step fills, and its replay once recorded."""

    buffers: list[torch.Tensor]
    input_ids: torch.Tensor   # [rows, 1]
    positions: torch.Tensor   # [rows, 1]
    mask: torch.Tensor        # [rows, 1, 1, capacity], bool
    column: torch.Tensor      # [1]: where the step writes its keys and values
    replay: Step | None = None


class StaticDecode:
    """Decode steps at fixed shapes over a batch's cache buffers, recorded by CAPTURES[`mode`] and replayed until
    the buffers move. `recordings` counts the recordings made (one per buffer set)."""

    def __init__(self, model, cache_keyword: str, pad_id: int, autocast_dtype: torch.dtype | None, mode: str):
        self.model, self.cache_keyword, self.pad_id, self.autocast_dtype = model, cache_keyword, pad_id, autocast_dtype
        self.capture = CAPTURES[mode]
        self.recordings = 0
        self._recording: _Recording | None = None

    @staticmethod
    def fits(cache, rows: int, columns: int) -> bool:
        """Whether the next step of a batch of `rows` rows and `columns` columns can run at fixed shapes: every
        layer of its cache is a GrowingLayer holding those rows and columns, with room for one more."""
        return bool(cache.layers) and all(
            isinstance(layer, kv_cache.GrowingLayer) and layer.buffers is not None and layer.length == columns
            and columns < layer.buffers[0].shape[2] and rows <= layer.buffers[0].shape[0] for layer in cache.layers)

    def __call__(self, cache, attention: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """Run the batch's next tokens `input_ids` [rows, 1] after its columns `attention` [rows, columns] (see
        `fits`); the cache gains their keys and values. Returns the logits [rows, vocab], float32. Raises
        CaptureFailed if the step cannot be recorded (the cache's filled columns are then as they were)."""
        rows, columns = attention.shape
        buffers = [buffer for layer in cache.layers for buffer in layer.buffers]
        recording = self._recording
        if recording is None or any(a is not b for a, b in zip(recording.buffers, buffers, strict=True)):
            self._recording = None   # let go of the old buffers first
            recording = self._recording = _inputs(buffers, self.pad_id)
        recording.input_ids.fill_(self.pad_id)
        recording.input_ids[:rows] = input_ids
        recording.positions.zero_()
        recording.positions[:rows, 0] = attention.sum(-1)   # each row's next position: its filled columns
        recording.mask.zero_()
        recording.mask[:rows, 0, 0, :columns] = attention.bool()
        recording.mask[:, 0, 0, columns] = True
        recording.column.fill_(columns)
        if recording.replay is None:   # recorded with this step's inputs: a warm-up run writes the right column
            recording.replay = self._record(cache, recording)
        logits = recording.replay()[:rows].to(torch.float32, copy=True)   # the next replay overwrites its tensor
        kv_cache.advance(cache)
        return logits

    def _record(self, cache, recording: _Recording) -> Step:
        autocast = (torch.autocast(recording.mask.device.type, dtype=self.autocast_dtype, cache_enabled=False)
                    if self.autocast_dtype else contextlib.nullcontext())   # a graph cannot keep autocast's cache

        def step() -> torch.Tensor:
            with autocast, kv_cache.static_writes(cache, recording.column):
                out = self.model(input_ids=recording.input_ids, attention_mask=recording.mask,
                                 position_ids=recording.positions, use_cache=True, logits_to_keep=1,
                                 **{self.cache_keyword: cache})
            return out.logits[:, -1]

        try:
            replay = self.capture(step)
        except Exception as error:
            raise CaptureFailed(f"{type(error).__name__}: {error}") from error
        self.recordings += 1
        return replay


def _inputs(buffers: list[torch.Tensor], pad_id: int) -> _Recording:
    """A step's input tensors for cache buffers `buffers` (all [rows, heads, capacity, dim] on one device)."""
    rows, capacity, device = buffers[0].shape[0], buffers[0].shape[2], buffers[0].device
    return _Recording(buffers, torch.full((rows, 1), pad_id, dtype=torch.long, device=device),
                      torch.zeros((rows, 1), dtype=torch.long, device=device),
                      torch.zeros((rows, 1, 1, capacity), dtype=torch.bool, device=device),
                      torch.zeros(1, dtype=torch.long, device=device))
