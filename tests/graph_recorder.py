"""A CPU stand-in for capturing a CUDA graph (engines/decode_graph.CAPTURES): record one run's aten ops, replay them.

A CUDA graph replays the kernels its capture launched, on the same tensors, with the arguments they had then:
whatever Python decided while capturing (a shape, a slice bound, a scalar) stays as it was, and a capture fails at
any op that reads a tensor back to the host. `record_and_replay` runs a step once under a TorchDispatchMode that
records every aten op, then replays those ops with the same non-tensor arguments on the same tensors that existed
before (weights, cache buffers, the step's inputs), the replayed ops' results standing for the recorded ones. So a
step that depends on a Python value that changes from step to step replays wrong here as it would on a GPU, and
one that reads a tensor back fails here as its capture would."""

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

aten = torch.ops.aten
HOST_READS = {aten.item, aten._local_scalar_dense, aten.nonzero, aten.masked_select, aten.equal, aten.is_nonzero,
              aten.lift_fresh}   # .item() / bool(tensor) / data-dependent shapes / a tensor made from Python data
HOST_COPIES = {torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu}   # reads that bypass aten


def _host_read(what) -> RuntimeError:
    return RuntimeError(f"{what} reads a tensor back to the host (or makes one from Python data): "
                        "a CUDA graph capture fails there")


class _NoHostCopies(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in HOST_COPIES:
            raise _host_read(func.__name__)
        return func(*args, **(kwargs or {}))


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket in HOST_READS:
            raise _host_read(func)
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))   # holding every tensor: no id is reused while recording
        return out


def record_and_replay(step):
    """CAPTURES' signature: run `step` once, recording it, and return its replay."""
    recorder = _Recorder()
    with recorder, _NoHostCopies():
        result = step()

    def replay():
        fresh = {}   # id of a recorded op's result -> the replayed op's

        def swap(x):
            return fresh.get(id(x), x) if isinstance(x, torch.Tensor) else x

        for func, args, kwargs, out in recorder.ops:
            new = func(*tree_map(swap, args), **tree_map(swap, kwargs))
            for old, now in zip(tree_leaves(out), tree_leaves(new)):
                if isinstance(old, torch.Tensor):
                    fresh[id(old)] = now
        return swap(result)
    return replay
