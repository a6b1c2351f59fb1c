"""The data contract: what a rollout produces and what training consumes.

Invariants (DESIGN.md section 2):
- `Turn.prompt_ids` are exactly the ids sent to the engine and `Turn.response_ids` exactly the ids it
  sampled; nothing downstream re-derives ids from text.
- Only sampled ids carry loss. In a `SampleBatch`, `loss_mask[r][t] == 1` iff `input_ids[r][t]` was
  sampled by the policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Turn:
    """One call of the policy and the env step it led to."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float] | None
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    action: str | None = None
    valid_action: bool = True
    info: dict = field(default_factory=dict)
    state_key: str | None = None        # the env state the turn started from (TextEnv.state_key; GiGPO)
    seat: int | None = None             # the game seat that played the turn (TextEnv.seat); None: no seats
    policy: str | None = None           # the opponent that played it (rollout/seat_opponents.py); None: the policy


@dataclass
class Task:
    """One problem for the agent loop: its opening `messages` (system + user) and its own fields
    (`data`, e.g. the reference answer), which reach the reward function through the Episode."""

    task_id: str
    seed: int
    messages: list[dict]
    data: dict = field(default_factory=dict)


@dataclass
class Episode:
    """The turns of one episode that fall in one batch.

    With fixed-turn batching an episode can span batches: each batch then holds a fragment with the
    same `episode_id`. A fragment whose last turn neither terminated nor truncated was cut by the
    batch boundary. `bootstrap_prompt_ids` is the prompt of s_{T+1}, the state after the last turn,
    whenever that state's value is needed (cut or time-limit truncation); None after termination.
    `metrics` holds the whole episode's summary (return, length, success) on its final fragment only.
    `data` carries the task's own fields for reward functions (agent-loop episodes).
    """

    episode_id: str
    task: str
    seed: int
    group_id: str | None = None
    turns: list[Turn] = field(default_factory=list)
    bootstrap_prompt_ids: list[int] | None = None
    outcome_reward: float | None = None
    metrics: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return bool(self.turns) and (self.turns[-1].terminated or self.turns[-1].truncated)


@dataclass
class Segment:
    """One turn's response inside a training row: tokens `start .. start+length-1` of row `row`.

    `next_segment` is the index of the next turn of the same episode in the batch (-1 if none);
    `bootstrap` indexes `SampleBatch.bootstrap_prompts` for V(s_{T+1}) when there is no next turn and
    the episode did not terminate (-1 otherwise).
    """

    row: int
    start: int
    length: int
    reward: float
    episode_end: bool
    next_segment: int = -1
    bootstrap: int = -1


@dataclass
class SampleBatch:
    """Training rows built from episodes by a pure function (per_turn, merge_turns).

    `input_ids[r]` and `loss_mask[r]` have equal length; `segments` lists every turn's response
    tokens in row coordinates, so per-turn quantities (GAE) can be gathered from row tensors.
    """

    input_ids: list[list[int]]
    loss_mask: list[list[int]]
    segments: list[Segment]
    bootstrap_prompts: list[list[int]]
