"""The served policy is the learner's: after each weight sync, the engine and the learner score the same rows.

    probe rows   `probe_rows` turns of the run's first batch, as sampled (prompt and response ids of the first
                 turn of its first episodes: the shortest prompts)
    gap          the mean, over the probe rows' response tokens, of |logp_engine - logp_learner|, both at
                 temperature 1 (the model's own softmax): the engine with the weights it serves
                 (TrainingEngine.score), the learner with the weights it holds (learner/scoring.token_logprobs)
    floor        the gap before the first update, both sides on the same weights: the rounding of the two
                 forwards alone (about 1e-7 for the hf engine in fp32, 1e-3 to 1e-2 under bf16: BENCHMARKS.md)
    after each sync   the run stops when  gap > limit = max(max_growth x floor, min_gap)
                      (EngineOutOfSync, naming the engine, its weights version and the gap)

The check reads the served policy itself, not the batch it sampled, so it works the same at every
`max_staleness` (a batch sampled ahead by older weights tells nothing of the last sync), with a producer thread
or process, and with every engine. A sync that did not reach the engine, or reached part of it (a layer the
engine's copy did not take, adapters dropped: verl issue #7495, a LoRA adapter that never reached vLLM, taken for
staleness for two months), leaves the engine on other weights than those the learner just sent: its gap is then
what the updates since moved the probe rows' log-probs. `rollout/sync_probe_drift` is what the last update moved
them (the learner's scores after this sync against after the last one): a sync the engine missed is seen at once
when its drift is past the limit, else once the drifts add up past it. The cost, one forward of the probe rows
on each side per sync, is `timing/sync_probe_s`. The checkpoint keeps the rows, the floor and the learner's last
scores (`state_dict`), so a resumed run probes as the run it continues would have.

Under torchrun each rank probes its own engine with rows of its own batch; the gap and the floor are the
largest of any rank's, so every rank decides alike.
"""

from __future__ import annotations

import time

from horizonrl.config import TrainConfig
from horizonrl.engines.base import ScoredRow, TrainingEngine
from horizonrl.learner.distributed import LOCAL, Ranks
from horizonrl.learner.scoring import response_logprobs
from horizonrl.learner.shared_prefix import Sharing
from horizonrl.records import Episode


class EngineOutOfSync(RuntimeError):
    """The engine samples from other weights than the learner's (a stale or partial weight sync)."""


def served_by(cfg: TrainConfig) -> str:
    """The engine that samples the rollouts, as the errors about it name it."""
    return cfg.rollout.engine_spec.served_by.format(r=cfg.rollout)


class SyncCheck:
    """The check of the module docstring. `start` before the first update (it keeps the probe rows and measures
    the floor, once); `after_sync` after every weight sync. `max_growth` None: no check (both do nothing).
    `sharing`: the actor's prefix sharing, which its scores of the probe rows use."""

    def __init__(self, engine_name: str, max_growth: float | None, min_gap: float, probe_rows: int,
                 ranks: Ranks = LOCAL, sharing: Sharing | None = None):
        self.engine_name, self.max_growth, self.min_gap, self.probe_rows = engine_name, max_growth, min_gap, probe_rows
        self.ranks, self.sharing = ranks, sharing
        self.rows: list[ScoredRow] | None = None
        self.floor: float | None = None
        self.learner_scores: list[list[float]] = []   # the learner's scores of the rows at the last probe

    def start(self, episodes: list[Episode], engine: TrainingEngine, actor) -> None:
        """Keep the probe rows of `episodes` (the run's first batch on this rank) and measure the floor, once."""
        if self.max_growth is None or self.rows is not None:
            return
        firsts = [e.turns[0] for e in episodes if e.turns and e.turns[0].response_ids]
        self.rows = [ScoredRow(t.prompt_ids, t.response_ids) for t in firsts[:self.probe_rows]]
        self.floor = self._gap(engine, actor)

    def after_sync(self, engine: TrainingEngine, actor) -> dict[str, float]:
        """The probe's metrics after a sync; EngineOutOfSync when its gap is past the limit."""
        if self.max_growth is None:
            return {}
        started = time.perf_counter()
        previous = self.learner_scores
        gap = self._gap(engine, actor)
        drift = self._largest(mean_abs_diff(self.learner_scores, previous))
        limit = max(self.max_growth * self.floor, self.min_gap)
        if gap > limit:
            version = engine.weights_version
            raise EngineOutOfSync(
                f"{self.engine_name} serves other weights than the learner sent it at weights version {version}: "
                f"on {len(self.rows)} probe rows of the first batch its log-probs are {gap:.4g} per token from the "
                f"learner's, against {self.floor:.4g} on the same weights before the first update (limit {limit:.4g} "
                f"= max({self.max_growth:g} x that, {self.min_gap:g}); the last update moved the learner's own by "
                f"{drift:.4g}). The weight sync did not reach the engine whole (a stale or partial sync: check that "
                "every weight, LoRA adapters included, reaches it). rollout.sync_check.max_growth: null turns this "
                "check off.")
        return {"rollout/sync_probe_gap": gap, "rollout/sync_probe_floor": self.floor,
                "rollout/sync_probe_drift": drift, "rollout/sync_probe_limit": limit,
                "timing/sync_probe_s": time.perf_counter() - started}

    def state_dict(self) -> dict:
        """The rows, the floor and the learner's last scores, JSON-able (all None before `start`)."""
        rows = None if self.rows is None else [[r.prompt_ids, r.response_ids] for r in self.rows]
        return {"rows": rows, "floor": self.floor, "learner_scores": self.learner_scores}

    def load_state_dict(self, state: dict) -> None:
        rows = state["rows"]
        self.rows = None if rows is None else [ScoredRow(prompt, response) for prompt, response in rows]
        self.floor, self.learner_scores = state["floor"], state["learner_scores"]

    def _gap(self, engine: TrainingEngine, actor) -> float:
        """The largest rank's mean |engine - learner| over the probe rows' response tokens; keeps the learner's
        scores."""
        self.learner_scores = learner_scores(actor, self.rows, self.sharing)
        return self._largest(mean_abs_diff(engine.score(self.rows) if self.rows else [], self.learner_scores))

    def _largest(self, value: float) -> float:
        return max(self.ranks.gather(value))


def learner_scores(actor, rows: list[ScoredRow], sharing: Sharing | None = None) -> list[list[float]]:
    """The learner's log-prob of each response token of each row at temperature 1 (one forward, sharing prefixes
    with the actor's `sharing`; on every rank, as a sharded actor needs, rows or none)."""
    return response_logprobs(actor, [(row.prompt_ids, row.response_ids) for row in rows], 1.0, sharing)


def mean_abs_diff(a: list[list[float]], b: list[list[float]]) -> float:
    """Mean |a - b| over the tokens of rows `a` and `b` (0 when there are none, or `b` is empty: no scores yet)."""
    if not b:
        return 0.0
    diffs = [abs(x - y) for row_a, row_b in zip(a, b, strict=True) for x, y in zip(row_a, row_b, strict=True)]
    return sum(diffs) / max(len(diffs), 1)
