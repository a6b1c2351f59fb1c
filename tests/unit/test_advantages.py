"""Unit tests for horizonrl.algos.advantages: dual-discount GAE and whitening.

Golden values are worked out by hand in the comments / as literal float arithmetic.
"""

import math

import pytest
import torch

from horizonrl.algos.advantages import dual_discount_gae, whiten

torch.set_num_threads(1)

TOL = dict(rtol=1e-6, atol=1e-6)


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def close(actual, expected, **tol):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), **(tol or TOL))


# ---------------------------------------------------------------------------------------------
# 1. hand-computed 2-turn chain, token params != step params, padding in one row
# ---------------------------------------------------------------------------------------------

def test_two_turn_chain_by_hand():
    gs, ls, gt, lt = 0.9, 0.8, 0.95, 0.7
    # row 0: turn 1, 3 tokens, links to row 1.  row 1: turn 2, 2 tokens + 1 padding, terminated.
    rewards = t([[0.1, -0.2, 0.3], [0.05, 1.3, 7.0]])  # 7.0 and 9.0 are padding garbage
    values = t([[0.4, 0.6, 0.35], [0.7, 0.25, 9.0]])
    mask = t([[1, 1, 1], [1, 1, 0]])
    adv, ret = dual_discount_gae(
        rewards, values, mask,
        episode_end=torch.tensor([False, True]),
        next_row=torch.tensor([1, -1]),
        bootstrap_value=t([123.0, 456.0]),  # must be ignored: row 0 linked, row 1 terminated
        gamma_step=gs, lambda_step=ls, gamma_token=gt, lambda_token=lt,
    )
    # row 1, k=1 (last token, terminated): delta = 1.3 + 0.9*0 - 0.25 = 1.05 ; A = 1.05
    a11 = 1.3 - 0.25
    # row 1, k=0 (token link): delta = 0.05 + 0.95*0.25 - 0.7 = -0.4125 ; A = -0.4125 + 0.95*0.7*1.05 = 0.28575
    a10 = (0.05 + 0.95 * 0.25 - 0.7) + 0.95 * 0.7 * a11
    # row 0, k=2 (step link to row 1 col 0): delta = 0.3 + 0.9*0.7 - 0.35 = 0.58 ; A = 0.58 + 0.9*0.8*0.28575 = 0.78574
    a02 = (0.3 + 0.9 * 0.7 - 0.35) + 0.9 * 0.8 * a10
    # row 0, k=1: delta = -0.2 + 0.95*0.35 - 0.6 = -0.4675 ; A = -0.4675 + 0.665*0.78574 = 0.0550171
    a01 = (-0.2 + 0.95 * 0.35 - 0.6) + 0.95 * 0.7 * a02
    # row 0, k=0: delta = 0.1 + 0.95*0.6 - 0.4 = 0.27 ; A = 0.27 + 0.665*0.0550171 = 0.30658637...
    a00 = (0.1 + 0.95 * 0.6 - 0.4) + 0.95 * 0.7 * a01
    assert a11 == pytest.approx(1.05)
    assert a10 == pytest.approx(0.28575)
    assert a02 == pytest.approx(0.78574)
    assert a01 == pytest.approx(0.0550171)
    assert a00 == pytest.approx(0.306586371500)

    close(adv, [[a00, a01, a02], [a10, a11, 0.0]])
    close(ret, [[a00 + 0.4, a01 + 0.6, a02 + 0.35], [a10 + 0.7, a11 + 0.25, 0.0]])


# ---------------------------------------------------------------------------------------------
# 2. Verlog closed forms (gamma_token = lambda_token = 1, reward only at the very end)
# ---------------------------------------------------------------------------------------------

def test_verlog_closed_forms_three_turns():
    gs, ls = 0.97, 0.85
    r = 0.83
    v0 = [0.21, -0.37, 0.44, 9.9]   # turn 1: 3 tokens + padding
    v1 = [0.58, 0.12, 9.9, 9.9]     # turn 2: 2 tokens + padding
    v2 = [0.66, 0.31, -0.09, 0.47]  # turn 3 (terminated): 4 tokens, reward r on the last one
    values = t([v0, v1, v2])
    mask = t([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    rewards = t([[0, 0, 0, 5.0], [0, 0, 5.0, 5.0], [0, 0, 0, r]])  # 5.0: padding garbage
    adv, _ = dual_discount_gae(
        rewards, values, mask,
        episode_end=torch.tensor([False, False, True]),
        next_row=torch.tensor([1, 2, -1]),
        bootstrap_value=t([0.0, 0.0, 3.0]),
        gamma_step=gs, lambda_step=ls, gamma_token=1.0, lambda_token=1.0,
    )
    # last turn: A_t = r - V_t on every token
    for k in range(4):
        assert adv[2, k].item() == pytest.approx(r - v2[k], abs=1e-6)
    # second-to-last turn: A_t = gs*(ls*r + (1-ls)*V_last_col0) - V_t
    for k in range(2):
        expected = gs * (ls * r + (1 - ls) * v2[0]) - v1[k]
        assert adv[1, k].item() == pytest.approx(expected, abs=1e-6)
    # third-to-last turn (same telescoping, no rewards in turn 2):
    #   A_t = gs*(V_{1,0} + ls*A_{1,0}) - V_t, with A_{1,0} from the line above.
    a_10 = gs * (ls * r + (1 - ls) * v2[0]) - v1[0]
    for k in range(3):
        expected = gs * (v1[0] + ls * a_10) - v0[k]
        assert adv[0, k].item() == pytest.approx(expected, abs=1e-6)
    # padding is zero
    assert adv[0, 3].item() == 0.0
    assert adv[1, 2:].abs().sum().item() == 0.0


# ---------------------------------------------------------------------------------------------
# 3. equal step/token parameters == ordinary GAE over the flat token sequence
# ---------------------------------------------------------------------------------------------

def reference_gae(rewards, values, dones, last_value, gamma, lam):
    """Plain single-sequence GAE with done flags (done[t]: the episode ended after token t).

    The token after the final one has value `last_value` and advantage 0 (truncation)."""
    n = len(rewards)
    adv = [0.0] * n
    for i in reversed(range(n)):
        if dones[i]:
            next_v, next_a = 0.0, 0.0
        elif i + 1 < n:
            next_v, next_a = values[i + 1], adv[i + 1]
        else:
            next_v, next_a = last_value, 0.0
        adv[i] = rewards[i] + gamma * next_v - values[i] + gamma * lam * next_a
    return adv


def _random_stream(gen, n_turns, width, end_terminated, mid_end_prob=0.0):
    """One stream of turns as python lists: per-turn lengths, rewards, values, episode_end flags."""
    turns = []
    for i in range(n_turns):
        n = int(torch.randint(1, width + 1, (1,), generator=gen))
        rew = (torch.randn(width, generator=gen) * 0.5).tolist()
        val = (torch.randn(width, generator=gen) * 0.5).tolist()
        last = i == n_turns - 1
        end = end_terminated if last else bool(torch.rand(1, generator=gen) < mid_end_prob)
        turns.append(dict(n=n, rew=rew, val=val, end=end))
    return turns


def _batch_from_streams(streams, width, gen):
    rewards, values, mask, ends, nxt, boots = [], [], [], [], [], []
    stream_rows = []
    for turns in streams:
        rows = []
        for i, turn in enumerate(turns):
            row = len(rewards)
            rows.append(row)
            rewards.append(turn["rew"])
            values.append(turn["val"])
            mask.append([1.0] * turn["n"] + [0.0] * (width - turn["n"]))
            ends.append(turn["end"])
            # next turn of the same stream (ignored by the estimator where the episode ended)
            nxt.append(row + 1 if i + 1 < len(turns) else -1)
            boots.append(float(torch.randn(1, generator=gen)))
        stream_rows.append(rows)
    batch = dict(
        token_rewards=t(rewards), values=t(values), response_mask=t(mask),
        episode_end=torch.tensor(ends), next_row=torch.tensor(nxt), bootstrap_value=t(boots),
    )
    return batch, stream_rows


def _flat_reference(batch, rows, gamma, lam):
    rew, val, dones = [], [], []
    r32, v32 = batch["token_rewards"].tolist(), batch["values"].tolist()
    for row in rows:
        n = int(batch["response_mask"][row].sum())
        rew += r32[row][:n]
        val += v32[row][:n]
        dones += [False] * (n - 1) + [bool(batch["episode_end"][row])]
    last = rows[-1]
    last_value = 0.0 if bool(batch["episode_end"][last]) else float(batch["bootstrap_value"][last])
    return reference_gae(rew, val, dones, last_value, gamma, lam)


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("gamma,lam", [(0.9, 0.8), (0.99, 0.95), (0.7, 1.0)])
def test_equal_params_is_ordinary_gae(seed, gamma, lam):
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(1000 + seed)
    width = 3
    streams = [
        _random_stream(gen, n_turns=4, width=width, end_terminated=False),  # ends with a bootstrap
        _random_stream(gen, n_turns=3, width=width, end_terminated=True),   # ends with episode_end
        _random_stream(gen, n_turns=5, width=width, end_terminated=False, mid_end_prob=0.4),
        _random_stream(gen, n_turns=1, width=width, end_terminated=True),
    ]
    batch, stream_rows = _batch_from_streams(streams, width, gen)
    adv, ret = dual_discount_gae(**batch, gamma_step=gamma, lambda_step=lam,
                                 gamma_token=gamma, lambda_token=lam)
    for rows in stream_rows:
        expected = _flat_reference(batch, rows, gamma, lam)
        got = []
        for row in rows:
            n = int(batch["response_mask"][row].sum())
            got += adv[row, :n].tolist()
        assert got == pytest.approx(expected, abs=1e-6, rel=1e-6)


def test_reference_gae_itself_by_hand():
    # sanity check of the helper: 2 tokens, truncated with last_value 0.5, gamma 0.9, lambda 0.8
    # A1 = 0.2 + 0.9*0.5 - 0.3 = 0.35 ; A0 = (1.0 + 0.9*0.3 - 0.4) + 0.72*0.35 = 0.87 + 0.252 = 1.122
    got = reference_gae([1.0, 0.2], [0.4, 0.3], [False, False], 0.5, 0.9, 0.8)
    assert got == pytest.approx([1.122, 0.35])


# ---------------------------------------------------------------------------------------------
# 4. bootstrap semantics
# ---------------------------------------------------------------------------------------------

def _single(rewards, values, mask, end, nxt, boot, **kw):
    params = dict(gamma_step=0.9, lambda_step=0.8, gamma_token=0.95, lambda_token=0.7)
    params.update(kw)
    return dual_discount_gae(t(rewards), t(values), t(mask), torch.tensor(end), torch.tensor(nxt),
                             t(boot), **params)


def test_truncated_row_uses_bootstrap_value():
    # one token, next_row=-1, not terminated: A = r + gamma_step*B - V = 0.4 + 0.9*1.7 - 0.25 = 1.68
    adv, ret = _single([[0.4]], [[0.25]], [[1]], [False], [-1], [1.7])
    close(adv, [[0.4 + 0.9 * 1.7 - 0.25]])
    close(ret, [[0.4 + 0.9 * 1.7 - 0.25 + 0.25]])
    # two tokens: A_1 = -0.1 + 0.9*1.7 - 0.6 = 0.83 (no lambda term: accumulator starts at 0)
    #             A_0 = (0.4 + 0.95*0.6 - 0.25) + 0.95*0.7*0.83 = 0.72 + 0.55195 = 1.27195
    adv, _ = _single([[0.4, -0.1]], [[0.25, 0.6]], [[1, 1]], [False], [-1], [1.7])
    a1 = -0.1 + 0.9 * 1.7 - 0.6
    a0 = (0.4 + 0.95 * 0.6 - 0.25) + 0.95 * 0.7 * a1
    assert a1 == pytest.approx(0.83) and a0 == pytest.approx(1.27195)
    close(adv, [[a0, a1]])


def test_bootstrap_value_changes_truncated_row_linearly():
    a, _ = _single([[0.4, -0.1]], [[0.25, 0.6]], [[1, 1]], [False], [-1], [1.7])
    b, _ = _single([[0.4, -0.1]], [[0.25, 0.6]], [[1, 1]], [False], [-1], [2.7])
    # +1 on B adds gamma_step on the last token and gamma_step*gamma_token*lambda_token before it
    close(b - a, [[0.9 * 0.95 * 0.7, 0.9]])


def test_episode_end_ignores_bootstrap_and_next_row():
    rewards = [[0.4, -0.1], [0.3, 0.0]]
    values = [[0.25, 0.6], [0.8, -0.45]]
    mask = [[1, 1], [1, 0]]
    # row 0 terminated: next value 0 and no accumulated advantage from row 1, even though
    # next_row points at row 1 (the next episode of the same stream) and bootstrap is set.
    base, base_ret = _single(rewards, values, mask, [True, True], [1, -1], [1.7, 2.2])
    other_boot, _ = _single(rewards, values, mask, [True, True], [1, -1], [-5.0, 40.0])
    no_link, _ = _single(rewards, values, mask, [True, True], [-1, -1], [0.0, 0.0])
    torch.testing.assert_close(base, other_boot, rtol=0, atol=0)
    torch.testing.assert_close(base, no_link, rtol=0, atol=0)
    # by hand: row 0: A_1 = -0.1 - 0.6 = -0.7 ; A_0 = (0.4 + 0.95*0.6 - 0.25) + 0.665*(-0.7) = 0.72 - 0.4655 = 0.2545
    #          row 1: A_0 = 0.3 + 0.9*0 - 0.8 = -0.5
    close(base, [[0.72 - 0.4655, -0.7], [-0.5, 0.0]])
    close(base_ret, [[0.72 - 0.4655 + 0.25, -0.7 + 0.6], [-0.5 + 0.8, 0.0]])


def test_linked_row_ignores_its_bootstrap_value():
    rewards = [[0.4, -0.1], [0.3, 0.0]]
    values = [[0.25, 0.6], [0.8, -0.45]]
    mask = [[1, 1], [1, 0]]
    a, _ = _single(rewards, values, mask, [False, True], [1, -1], [1.7, 2.2])
    b, _ = _single(rewards, values, mask, [False, True], [1, -1], [-8.0, 2.2])
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    # by hand: row 1: A = 0.3 - 0.8 = -0.5
    # row 0: A_1 = -0.1 + 0.9*0.8 - 0.6 + 0.72*(-0.5) = 0.02 - 0.36 = -0.34
    #        A_0 = 0.72 + 0.665*(-0.34) = 0.72 - 0.2261 = 0.4939
    close(a, [[0.72 - 0.2261, 0.02 - 0.36], [-0.5, 0.0]])


# ---------------------------------------------------------------------------------------------
# 5. row order and several chains
# ---------------------------------------------------------------------------------------------

def test_rows_out_of_order_match_in_order():
    # chain of 3 turns: in order rows (0 -> 1 -> 2), terminated at 2.
    rewards = t([[0.11, -0.23, 0.0], [0.37, 0.0, 0.0], [-0.05, 0.19, 0.61]])
    values = t([[0.52, 0.33, 4.0], [-0.14, 4.0, 4.0], [0.28, 0.07, 0.45]])
    mask = t([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    kw = dict(gamma_step=0.93, lambda_step=0.81, gamma_token=0.97, lambda_token=0.66)
    adv, ret = dual_discount_gae(rewards, values, mask, torch.tensor([False, False, True]),
                                 torch.tensor([1, 2, -1]), t([0.0, 0.0, 0.0]), **kw)
    # reversed placement: old row 2 -> new 0, old 1 -> new 1, old 0 -> new 2 (next_row points back)
    perm = [2, 1, 0]
    adv_p, ret_p = dual_discount_gae(rewards[perm], values[perm], mask[perm],
                                     torch.tensor([True, False, False]), torch.tensor([-1, 0, 1]),
                                     t([0.0, 0.0, 0.0]), **kw)
    torch.testing.assert_close(adv_p, adv[perm], **TOL)
    torch.testing.assert_close(ret_p, ret[perm], **TOL)
    # a scrambled placement: old (0,1,2) -> new (1,2,0): new row 1 -> new 2 -> new 0
    perm = [2, 0, 1]  # new row j holds old row perm[j]
    adv_s, _ = dual_discount_gae(rewards[perm], values[perm], mask[perm],
                                 torch.tensor([True, False, False]), torch.tensor([-1, 2, 0]),
                                 t([0.0, 0.0, 0.0]), **kw)
    torch.testing.assert_close(adv_s, adv[perm], **TOL)
    # and a hand check of the terminal row: A_{2,2} = 0.61 - 0.45 = 0.16
    assert adv[2, 2].item() == pytest.approx(0.61 - 0.45, abs=1e-6)
    # row 1 (single token, step link): A = 0.37 + 0.93*0.28 - (-0.14) + 0.93*0.81*A_{2,0}
    assert adv[1, 0].item() == pytest.approx(
        0.37 + 0.93 * 0.28 + 0.14 + 0.93 * 0.81 * adv[2, 0].item(), abs=1e-6)


def test_random_permutation_of_rows_is_equivariant():
    gen = torch.Generator().manual_seed(7)
    width = 4
    streams = [
        _random_stream(gen, 4, width, end_terminated=False),
        _random_stream(gen, 3, width, end_terminated=True, mid_end_prob=0.5),
        _random_stream(gen, 2, width, end_terminated=False),
    ]
    batch, _ = _batch_from_streams(streams, width, gen)
    kw = dict(gamma_step=0.91, lambda_step=0.77, gamma_token=0.98, lambda_token=0.6)
    adv, ret = dual_discount_gae(**batch, **kw)
    n = adv.shape[0]
    for seed in range(5):
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(n)
        old_next = batch["next_row"]
        new_next = torch.where(old_next[perm] >= 0, inv[old_next[perm].clamp(min=0)], old_next[perm])
        permuted = {k: v[perm] for k, v in batch.items()}
        permuted["next_row"] = new_next
        adv_p, ret_p = dual_discount_gae(**permuted, **kw)
        torch.testing.assert_close(adv_p, adv[perm], **TOL)
        torch.testing.assert_close(ret_p, ret[perm], **TOL)


def test_independent_chains_in_one_batch():
    kw = dict(gamma_step=0.9, lambda_step=0.8, gamma_token=0.95, lambda_token=0.7)
    # chain A: rows 0 -> 2 (terminated). chain B: row 1 -> row 3 (truncated, bootstrap 0.9).
    rewards = t([[0.1, -0.2], [0.33, 0.0], [0.05, 1.3], [-0.4, 0.27]])
    values = t([[0.4, 0.6], [0.12, 2.0], [0.7, 0.25], [0.5, -0.3]])
    mask = t([[1, 1], [1, 0], [1, 1], [1, 1]])
    ends = torch.tensor([False, False, True, False])
    nxt = torch.tensor([2, 3, -1, -1])
    boot = t([0.0, 0.0, 0.0, 0.9])
    adv, _ = dual_discount_gae(rewards, values, mask, ends, nxt, boot, **kw)
    a_only, _ = dual_discount_gae(rewards[[0, 2]], values[[0, 2]], mask[[0, 2]],
                                  ends[[0, 2]], torch.tensor([1, -1]), boot[[0, 2]], **kw)
    b_only, _ = dual_discount_gae(rewards[[1, 3]], values[[1, 3]], mask[[1, 3]],
                                  ends[[1, 3]], torch.tensor([1, -1]), boot[[1, 3]], **kw)
    torch.testing.assert_close(adv[[0, 2]], a_only, **TOL)
    torch.testing.assert_close(adv[[1, 3]], b_only, **TOL)
    # chain B by hand:
    #   row 3, k=1: 0.27 + 0.9*0.9 - (-0.3) = 1.38
    #   row 3, k=0: (-0.4 + 0.95*(-0.3) - 0.5) + 0.665*1.38 = -1.185 + 0.9177 = -0.2673
    #   row 1, k=0: (0.33 + 0.9*0.5 - 0.12) + 0.72*(-0.2673) = 0.66 - 0.192456 = 0.467544
    close(adv[3], [-1.185 + 0.9177, 1.38])
    close(adv[1], [0.66 - 0.192456, 0.0])
    # chain A is the same as in test_two_turn_chain_by_hand with 2 tokens in row 0:
    #   row 2: A_1 = 1.05, A_0 = 0.28575
    #   row 0, k=1: (-0.2 + 0.9*0.7 - 0.6) + 0.72*0.28575 = -0.17 + 0.20574 = 0.03574
    #   row 0, k=0: (0.1 + 0.95*0.6 - 0.4) + 0.665*0.03574 = 0.27 + 0.0237671 = 0.2937671
    close(adv[2], [0.28575, 1.05])
    close(adv[0], [0.27 + 0.0237671, -0.17 + 0.20574])


# ---------------------------------------------------------------------------------------------
# 6. returns / masking
# ---------------------------------------------------------------------------------------------

def test_returns_are_advantages_plus_values_on_mask_and_zero_off_mask():
    gen = torch.Generator().manual_seed(3)
    width = 4
    streams = [_random_stream(gen, 3, width, end_terminated=False),
               _random_stream(gen, 2, width, end_terminated=True)]
    batch, _ = _batch_from_streams(streams, width, gen)
    # padding garbage that is large, to catch leaks
    off = batch["response_mask"] == 0
    batch["values"] = torch.where(off, torch.full_like(batch["values"], 1e3), batch["values"])
    batch["token_rewards"] = torch.where(off, torch.full_like(batch["values"], -1e3),
                                         batch["token_rewards"])
    assert off.any()
    adv, ret = dual_discount_gae(**batch)
    on = ~off
    torch.testing.assert_close(ret[on], adv[on] + batch["values"][on], **TOL)
    assert torch.all(ret[off] == 0)
    assert torch.all(adv[off] == 0)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()


# ---------------------------------------------------------------------------------------------
# 7. errors
# ---------------------------------------------------------------------------------------------

def _call(mask, nxt, ends=None):
    n, w = len(mask), len(mask[0])
    ends = ends if ends is not None else [False] * n
    return dual_discount_gae(torch.full((n, w), 0.1), torch.full((n, w), 0.2), t(mask),
                             torch.tensor(ends), torch.tensor(nxt), torch.zeros(n))


def test_empty_mask_row_raises():
    with pytest.raises(ValueError):
        _call([[1, 1, 0], [0, 0, 0]], [-1, -1])


@pytest.mark.parametrize("bad", [[0, 1, 1], [1, 0, 1], [0, 0, 1]])
def test_non_left_aligned_mask_raises(bad):
    with pytest.raises(ValueError):
        _call([[1, 1, 0], bad], [-1, -1])


@pytest.mark.parametrize("nxt", [[1, 0], [0, -1], [1, 2, 0]])
def test_cycle_in_next_row_raises(nxt):
    mask = [[1, 0]] * len(nxt)
    with pytest.raises(ValueError):
        _call(mask, nxt)


def test_next_row_out_of_range_raises():
    with pytest.raises(ValueError):
        _call([[1, 0], [1, 0]], [5, -1])


# ---------------------------------------------------------------------------------------------
# whiten
# ---------------------------------------------------------------------------------------------

def test_whiten_by_hand():
    x = t([[1.5, -0.5, 9.0], [2.0, 0.25, -7.0]])
    mask = t([[1, 1, 0], [1, 1, 0]])
    # masked entries 1.5, -0.5, 2.0, 0.25: mean = 3.25/4 = 0.8125
    # deviations 0.6875, -1.3125, 1.1875, -0.5625; squares sum 0.47265625+1.72265625+1.41015625+0.31640625
    #   = 3.921875 ; population var = 0.98046875
    std = math.sqrt(0.98046875 + 1e-8)
    out = whiten(x, mask)
    close(out, [[0.6875 / std, -1.3125 / std, 0.0], [1.1875 / std, -0.5625 / std, 0.0]])
    on = mask.bool()
    assert out[on].mean().item() == pytest.approx(0.0, abs=1e-6)
    assert out[on].std(unbiased=False).item() == pytest.approx(1.0, abs=1e-6)

    kept = whiten(x, mask, shift_mean=False)
    close(kept, [[0.6875 / std + 0.8125, -1.3125 / std + 0.8125, 0.0],
                 [1.1875 / std + 0.8125, -0.5625 / std + 0.8125, 0.0]])
    assert kept[on].mean().item() == pytest.approx(0.8125, abs=1e-6)
    assert kept[on].std(unbiased=False).item() == pytest.approx(1.0, abs=1e-6)
    assert torch.all(kept[~on] == 0)


def test_whiten_random_moments():
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(5, 7, generator=gen) * 3.0 + 2.0
    mask = (torch.rand(5, 7, generator=gen) < 0.6).float()
    mask[0, 0] = 1.0
    mask[1, 1] = 1.0
    out = whiten(x, mask)
    on = mask.bool()
    assert out[on].mean().item() == pytest.approx(0.0, abs=1e-6)
    assert out[on].std(unbiased=False).item() == pytest.approx(1.0, abs=1e-6)
    assert torch.all(out[~on] == 0)
