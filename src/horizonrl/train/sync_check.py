"""The served policy is the learner's: after each weight sync, a check of the engine/learner log-prob gap.

`rollout/logprob_abs_diff_current` is the mean, over the batch's tokens that the weights being trained sampled
(all of them without asynchronous training; `rollout/current_weights_frac` of them with it), of
|logp_old - logp_engine|: the learner's log-prob of each token against the one the engine reported when it
sampled it. With the engine on the learner's weights it is float rounding (~1e-7 for the hf engine in fp32,
~0.005 for vLLM in bf16, ~0.02 with LoRA on a GPU: BENCHMARKS.md). An engine that missed a sync, or took
part of it (verl issue #7495: a LoRA adapter that never reached vLLM, taken for staleness for two months),
samples from other weights: its gap grows far beyond what the run's own first iterations showed.

    baseline  = max(gap over the first `baseline_iterations` iterations that report one)
    the run stops when   gap > max(max_growth * baseline, min_gap)

The first iteration's batch is sampled before any sync, by the weights the engine was built with, so the
baseline holds the rounding of a sync that cannot have gone wrong. `min_gap` keeps rounding from making a limit
that rounding itself could pass. A resumed run measures its baseline afresh.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GAP = "rollout/logprob_abs_diff_current"
CURRENT = "rollout/current_weights_frac"


class EngineOutOfSync(RuntimeError):
    """The engine samples from other weights than the learner's (a stale or partial weight sync)."""


@dataclass
class SyncCheck:
    engine: str                      # what the error names: "the vllm engine", ...
    max_growth: float | None         # None: no check
    min_gap: float
    baseline_iterations: int
    baseline: list[tuple[int, float]] = field(default_factory=list)   # (iteration, gap)

    def check(self, record: dict) -> None:
        """After iteration record["iteration"] (whose batch the engine sampled after the sync before it):
        EngineOutOfSync when its gap is past the limit. A record without the gap (no actor update, an engine
        that returns no log-probs) or with no token of the current weights is not checked."""
        if self.max_growth is None or not record.get(CURRENT):
            return
        gap = record[GAP]
        if len(self.baseline) < self.baseline_iterations:
            self.baseline.append((record["iteration"], gap))
            return
        first = max(g for _, g in self.baseline)
        limit = max(self.max_growth * first, self.min_gap)
        if gap > limit:
            iterations = f"{self.baseline[0][0]}-{self.baseline[-1][0]}"
            raise EngineOutOfSync(
                f"{self.engine} sampled iteration {record['iteration']}'s batch from other weights than the "
                f"learner's: {GAP} {gap:.4g} per token, against at most {first:.4g} in iterations {iterations} "
                f"(limit {limit:.4g} = max({self.max_growth:g} x that, {self.min_gap:g})). The weight sync before "
                "it did not reach the engine whole (a stale or partial sync: check that every weight, LoRA adapters "
                "included, reaches it). rollout.sync_check.max_growth: null turns this check off.")
