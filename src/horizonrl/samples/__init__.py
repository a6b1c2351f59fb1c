from horizonrl.samples.merge import MergeReport, merge_turns, write_mismatches
from horizonrl.samples.per_turn import per_turn
from horizonrl.samples.tensors import TurnIndex, pad, row_tensors

__all__ = ["MergeReport", "TurnIndex", "merge_turns", "pad", "per_turn", "row_tensors", "write_mismatches"]
