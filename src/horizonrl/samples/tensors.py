"""A batch's training rows as tensors (`Rows`), and moving per-token values between the row layout and the turn
layout.

Row layout: [R, T], token-aligned with `input_ids` (right padding).
Turn layout: [N, L], one row per segment (turn), its response tokens left-aligned; this is the layout
`dual_discount_gae` works in.
"""

from __future__ import annotations

import dataclasses
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


@dataclass(frozen=True)
class Rows:
    """Training rows: every tensor [R, T], token-aligned with input_ids (right padding), zero where loss_mask is 0.
    The first three come from the samples (`of`); each later field is None until what its comment names sets it
    (`dataclasses.replace`), and a field that is None stays None in `select` and `empty`."""

    input_ids: Tensor                         # long; the pad id past a row's end
    attention_mask: Tensor                    # long; 1 on the row's tokens
    loss_mask: Tensor                         # float; 1 on the sampled tokens, the ones trained
    logp_engine: Tensor | None = None         # the engine's log-probs; None when some turn came without them
    sampled_by_current: Tensor | None = None  # 1 on the tokens of turns the weights being trained sampled; None when
                                              # some turn has no weights version or none was given (train/batch.py)
    logp_old: Tensor | None = None            # the actor's log-probs before the update; None when not scored
    entropy: Tensor | None = None             # the actor's entropies, scored with logp_old
    logp_ref: Tensor | None = None            # the reference's log-probs; None when not scored
    values_old: Tensor | None = None          # the critic's values before the update; None when not scored
    advantages: Tensor | None = None          # the family's advantages (train/ppo.py, train/group.py)
    returns: Tensor | None = None             # the family's returns, with the advantages

    @classmethod
    def of(cls, batch: SampleBatch, pad_id: int, device=None) -> Rows:
        """input_ids, attention_mask and loss_mask of `batch`'s rows."""
        return cls(pad(batch.input_ids, pad_id, torch.long, device),
                   pad([[1] * len(r) for r in batch.input_ids], 0, torch.long, device),
                   pad(batch.loss_mask, 0, torch.float32, device))

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def tensors(self) -> dict[str, Tensor]:
        """The fields that are set, by name."""
        return {f.name: value for f in dataclasses.fields(self) if (value := getattr(self, f.name)) is not None}

    def select(self, rows: list[int]) -> Rows:
        """`rows` of every tensor, trimmed to the longest of them (rows are right-padded)."""
        index = torch.tensor(rows, device=self.input_ids.device)
        width = int(self.attention_mask[index].sum(dim=1).max())
        return Rows(**{name: value[index, :width] for name, value in self.tensors().items()})

    def empty(self) -> Rows:
        """Rows that change nothing, of the same fields: one row of two tokens, the second "sampled", every other
        value zero. A rank with fewer micro-batches than another runs these (its loss times zero), so that every
        rank joins the same number of FSDP collectives and every parameter gets a gradient."""
        zeros = {name: torch.zeros((1, 2), dtype=value.dtype, device=value.device)
                 for name, value in self.tensors().items()}
        zeros["attention_mask"] += 1
        zeros["loss_mask"][0, 1] = 1
        return Rows(**zeros)


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
