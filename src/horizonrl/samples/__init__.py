from horizonrl.samples.merge import MergeReport, merge_turns, write_mismatches
from horizonrl.samples.per_turn import per_turn
from horizonrl.samples.tensors import Rows, TurnIndex, pad

__all__ = ["MergeReport", "Rows", "TurnIndex", "merge_turns", "pad", "per_turn", "write_mismatches"]
