from horizonrl.samples.per_turn import per_turn
from horizonrl.samples.tensors import TurnIndex, pad, row_tensors

__all__ = ["TurnIndex", "pad", "per_turn", "row_tensors"]
