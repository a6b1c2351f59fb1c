"""Iteration metrics over ranks: each rank contributes sums and counts (and the few invalid-output
examples rank 0 writes), never its episodes or token tensors; the reduced metrics are those of every
rank's episodes pooled in one process.

Ranks are simulated by threads whose collectives meet on a shared board and reduce in rank order, as
gloo's do; each rank counts the bytes it puts into the collectives."""

import dataclasses
import math
import pickle
import threading

import pytest
import torch

from horizonrl.algos.losses import explained_variance
from horizonrl.records import Episode, Turn
from horizonrl.report.metrics import episode_metrics
from horizonrl.train.batch import batch_metrics, prepare


class Board:
    def __init__(self, world: int):
        self.slots = [None] * world
        self.barrier = threading.Barrier(world, timeout=30)


class ThreadRanks:
    """Rank `rank` of the threads sharing `board`: every collective posts this rank's part, waits for every
    rank's and combines them in rank order. `sent` counts the bytes this rank contributed."""

    distributed = True

    def __init__(self, rank: int, board: Board):
        self.rank, self.world_size, self.board, self.sent = rank, len(board.slots), board, 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _exchange(self, part, nbytes: int) -> list:
        self.sent += nbytes
        self.board.slots[self.rank] = part
        self.board.barrier.wait()
        parts = list(self.board.slots)
        self.board.barrier.wait()
        return parts

    def gather(self, obj) -> list:
        data = pickle.dumps(obj)
        return [pickle.loads(part) for part in self._exchange(data, len(data))]

    def sum(self, values: list[float]) -> list[float]:
        parts = self._exchange([float(v) for v in values], 8 * len(values))
        return [sum(column) for column in zip(*parts)]

    def sum_tensor(self, t: torch.Tensor) -> torch.Tensor:
        return sum(self._exchange(t.clone(), t.numel() * t.element_size()))

    def max(self, value: int) -> int:
        return max(self._exchange(value, 8))


def on_ranks(world: int, fn) -> tuple[list, list[ThreadRanks]]:
    """fn(ranks) on `world` simulated ranks: (each rank's result, the ranks)."""
    board = Board(world)
    ranks = [ThreadRanks(r, board) for r in range(world)]
    results, errors = [None] * world, []

    def run(r):
        try:
            results[r] = fn(ranks[r])
        except BaseException as error:       # noqa: BLE001 - re-raised in the test's thread
            errors.append(error)
            board.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results, ranks


def turn(prompt_len: int, response: list[int], end: bool = False, valid: bool = True, **info) -> Turn:
    return Turn(list(range(3, 3 + prompt_len)), response, None, 0.5, terminated=end, valid_action=valid, info=info)


def episode(task: str, turns: list[Turn], **metrics) -> Episode:
    return Episode(f"{task}-{id(turns)}", task, 0, turns=turns, metrics=metrics,
                   bootstrap_prompt_ids=None if turns[-1].terminated else [1, 2])


def shares(prompt_len: int = 6, response_len: int = 2) -> list[list[Episode]]:
    """Three ranks' episodes: env-reported step metrics that not every rank reports, tool calls, invalid
    outputs (a duplicate across ranks, one over 80 characters, more than three in all), an errored episode,
    a cut fragment, two tasks."""
    def r(seed):
        return [seed + k for k in range(response_len)]

    rank0 = [episode("goto", [turn(prompt_len, r(10), valid=False, metrics={"dist": 3.0},
                                   invalid_output="go nowhere", finish_reason="length"),
                              turn(prompt_len + 4, r(20), end=True, metrics={"dist": 1.0})],
                     success=1.0, length=2, **{"return": 1.0}),
             episode("goto", [turn(prompt_len, r(30), engine_retries=2)], error="crash")]
    rank1 = [episode("pickup", [turn(prompt_len, r(40), end=True, valid=False, metrics={"dist": 2.0, "keys": 1},
                                     invalid_output="x" * 100, tool_call_parse_failed=True,
                                     tool_calls=[{"error": None}, {"error": "timeout"}])],
                     success=0.0, length=1, **{"return": -1.0}),
             episode("pickup", [turn(prompt_len, r(50), valid=False, invalid_output="go nowhere")])]
    rank2 = [episode("goto", [turn(prompt_len, r(60), valid=False, invalid_output="third",
                                   tool_calls=[{"error": "bad_args"}]),
                              turn(prompt_len, r(70), valid=False, invalid_output="fourth"),
                              turn(prompt_len, r(80), end=True)],
                     success=1.0, length=3, **{"return": 0.5})]
    return [rank0, rank1, rank2]


def assert_same_metrics(got: dict, expected: dict) -> None:
    assert list(got) == list(expected)
    for key, value in expected.items():
        if isinstance(value, float):
            assert got[key] == pytest.approx(value, rel=1e-12, nan_ok=True), key
        else:
            assert got[key] == value and type(got[key]) is type(value), key


def test_episode_metrics_reduced_over_ranks_are_those_of_the_pooled_episodes():
    parts = shares()
    pooled = episode_metrics([e for part in parts for e in part])
    reduced, _ = on_ranks(3, lambda ranks: episode_metrics(parts[ranks.rank], ranks))
    for got in reduced:
        assert_same_metrics(got, pooled)
    by_hand = {  # finished and not errored: rank 0's first, rank 1's first, rank 2's
        "env/episodes": 3, "env/success_rate": 2 / 3, "env/episode_return": 0.5 / 3, "env/episode_length": 2.0,
        "env/errored_episodes": 1, "env/turns": 8, "env/valid_action_ratio": 3 / 8,
        "env/dist": 2.0, "env/keys": 1.0, "env/goto/success_rate": 1.0, "env/pickup/success_rate": 0.0,
        "env/goto/episodes": 2, "env/pickup/episodes": 1,
        "env/invalid_output_examples": ["go nowhere", "x" * 80, "third"],
        "rollout/response_length": 2.0, "rollout/prompt_length": 6.5, "rollout/truncated_responses": 1,
        "rollout/engine_retries": 2, "rollout/tool_call_parse_failures": 1, "rollout/tool_calls": 3,
        "rollout/tool_errors": 2, "rollout/tool_errors/timeout": 1, "rollout/tool_errors/bad_args": 1}
    assert_same_metrics({k: reduced[0][k] for k in by_hand}, by_hand)


def test_a_rank_without_finished_episodes_or_tool_calls_still_agrees():
    parts = [[episode("goto", [turn(4, [5])])], shares()[1]]     # rank 0: one cut fragment, nothing finished
    reduced, _ = on_ranks(2, lambda ranks: episode_metrics(parts[ranks.rank], ranks))
    pooled = episode_metrics(parts[0] + parts[1])
    assert reduced[0] == reduced[1] and reduced[0]["rollout/tool_calls"] == 2
    assert_same_metrics(reduced[0], pooled)
    alone, _ = on_ranks(2, lambda ranks: episode_metrics(parts[0] if ranks.rank == 0 else [], ranks))
    assert math.isnan(alone[1]["env/success_rate"]) and alone[1]["env/episodes"] == 0


def scored(episodes: list[Episode]):
    """Per-turn rows of `episodes` with returns and critic values that are functions of each token's id and
    position, so a token has the same ones whichever batch holds it."""
    batch = prepare(episodes, 0, "cpu")
    ids = batch.rows.input_ids.float()
    position = torch.arange(ids.shape[1]).float()
    batch.rows = dataclasses.replace(batch.rows, returns=torch.sin(1.3 * ids + 0.2 * position) * batch.rows.loss_mask,
                                     values_old=0.8 * torch.sin(1.3 * ids + 0.2 * position) + 0.3 * torch.cos(ids))
    return batch


def test_batch_metrics_reduced_over_ranks_are_those_of_the_pooled_rows():
    parts = shares()
    pooled = scored([e for part in parts for e in part])
    reduced, _ = on_ranks(3, lambda ranks: batch_metrics(scored(parts[ranks.rank]), ranks))
    sampled = pooled.rows.loss_mask.bool()
    r, v = pooled.rows.returns[sampled], pooled.rows.values_old[sampled]
    by_hand = {"data/mask_ones_ratio": 16 / float(pooled.rows.attention_mask.sum()), "data/rows": 8,
               "data/bootstrap_prompts": 2, "train/returns_mean": float(r.mean()),
               "train/critic/explained_variance": float(1 - (r - v).var(unbiased=False) / r.var(unbiased=False))}
    for got in reduced:
        assert list(got) == list(by_hand)
        for key, value in by_hand.items():
            assert got[key] == pytest.approx(value, rel=1e-5), key
    assert reduced[0] == reduced[1] == reduced[2]


def test_explained_variance_over_ranks_is_that_of_the_pooled_tokens():
    torch.manual_seed(0)
    returns, values = torch.randn(3, 7), torch.randn(3, 7)
    mask = (torch.rand(3, 7) < 0.7).float()
    reduced, _ = on_ranks(3, lambda ranks: explained_variance(values[ranks.rank:ranks.rank + 1],
                                                              returns[ranks.rank:ranks.rank + 1],
                                                              mask[ranks.rank:ranks.rank + 1], total=ranks.sum))
    assert reduced == [pytest.approx(explained_variance(values, returns, mask), rel=1e-5)] * 3


def metric_bytes(prompt_len: int, response_len: int) -> list[int]:
    """The bytes each rank puts into the collectives of an iteration's episode and batch metrics."""
    parts = shares(prompt_len, response_len)
    _, ranks = on_ranks(3, lambda ranks: (episode_metrics(parts[ranks.rank], ranks),
                                          batch_metrics(scored(parts[ranks.rank]), ranks)))
    return [r.sent for r in ranks]


def test_the_bytes_a_rank_sends_for_metrics_do_not_grow_with_the_episodes():
    small, large = metric_bytes(prompt_len=6, response_len=2), metric_bytes(prompt_len=3000, response_len=500)
    assert large == small
    assert max(small) < 2000      # a few dozen numbers, metric names and three examples
