"""Padding rows into tensors, and moving per-token values between the row layout and the turn layout.

Row layout: [R, T], token-aligned with `input_ids` (right padding).
Turn layout: [N, L], one row per segment (turn), its response tokens left-aligned; this is the layout
`dual_discount_gae` works in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from horizonrl.records import SampleBatch


def pad(rows: list[list], value, dtype: torch.dtype, device=None) -> Tensor:
    """Right-pad variable-length lists into a [len(rows), max_len] tensor."""
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), width), value, dtype=dtype, device=device)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=dtype, device=device)
    return out


def row_tensors(batch: SampleBatch, pad_id: int, device=None) -> dict[str, Tensor]:
    """input_ids, attention_mask, loss_mask as [R, T] tensors."""
    input_ids = pad(batch.input_ids, pad_id, torch.long, device)
    attention_mask = pad([[1] * len(r) for r in batch.input_ids], 0, torch.long, device)
    loss_mask = pad(batch.loss_mask, 0, torch.float32, device)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}


@dataclass(frozen=True)
class TurnIndex:
    """Where each turn's response tokens sit in the row layout: turn n, token k is at
    (row[n], col[n, k]) for k < length[n]."""

    row: Tensor      # [N] long
    col: Tensor      # [N, L] long, clamped inside the row where k >= length
    mask: Tensor     # [N, L] float, 1 for k < length

    @classmethod
    def of(cls, batch: SampleBatch, device=None) -> TurnIndex:
        width = max((s.length for s in batch.segments), default=0)
        k = torch.arange(width, device=device)
        start = torch.tensor([s.start for s in batch.segments], device=device)
        length = torch.tensor([s.length for s in batch.segments], device=device)
        mask = (k[None, :] < length[:, None]).float()
        col = start[:, None] + torch.minimum(k[None, :], (length - 1).clamp(min=0)[:, None])
        row = torch.tensor([s.row for s in batch.segments], dtype=torch.long, device=device)
        return cls(row, col, mask)

    def to_turns(self, x: Tensor) -> Tensor:
        """[R, T] -> [N, L]; zero on padding."""
        return x[self.row[:, None], self.col] * self.mask

    def to_rows(self, x: Tensor, shape: torch.Size) -> Tensor:
        """[N, L] -> [R, T]; zero outside the turns' response tokens."""
        out = torch.zeros(shape, dtype=x.dtype, device=x.device)
        keep = self.mask.bool()
        rows = self.row[:, None].expand_as(self.col)
        out[rows[keep], self.col[keep]] = x[keep]
        return out
