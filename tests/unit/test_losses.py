"""Unit tests for horizonrl.algos.losses. Golden values are worked out by hand."""

import dataclasses
import math

import pytest
import torch

from horizonrl.algos.losses import (
    aggregate,
    approx_kl,
    entropy_coef_at,
    explained_variance,
    first_token_weights,
    ppo_policy_loss,
    tis_weights,
    value_loss,
)
from horizonrl.samples.tensors import Rows

torch.set_num_threads(1)

TOL = dict(rtol=1e-6, atol=1e-6)


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def close(actual, expected):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), **TOL)


# ---------------------------------------------------------------------------------------------
# ppo_policy_loss
# ---------------------------------------------------------------------------------------------

LOGP_OLD = -1.37  # arbitrary old log-prob; logp = LOGP_OLD + log(ratio)


def _ppo(ratios, advs, **kw):
    logp_old = torch.full((len(ratios),), LOGP_OLD, dtype=torch.float64)
    logp = logp_old + torch.log(torch.tensor(ratios, dtype=torch.float64))
    return ppo_policy_loss(logp, logp_old, torch.tensor(advs, dtype=torch.float64), **kw)


def test_ppo_policy_loss_cases_by_hand():
    kw = dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    ratios = [1.1, 1.5, 0.6, 5.0, 1.5, 0.6, 2.0]
    advs = [0.7, 0.4, -0.5, -0.5, -0.5, 0.4, -0.5]
    loss, clipped = _ppo(ratios, advs, **kw)
    expected = [
        -0.7 * 1.1,  # inside [0.8, 1.28]: -A*rho = -0.77, not clipped
        -0.4 * 1.28,  # rho above 1+clip_high, A>0: max(-0.6, -0.512) = -0.512, clipped
        0.5 * 0.8,  # rho below 1-clip_low, A<0: max(0.3, 0.4) = 0.4, clipped
        0.5 * 3.0,  # dual clip: max(2.5, 0.64) = 2.5, then min(2.5, -A*3 = 1.5) = 1.5
        0.5 * 1.5,  # rho above 1+clip_high, A<0: max(0.75, 0.64) = 0.75 (pessimistic, unclipped)
        -0.4 * 0.6,  # rho below 1-clip_low, A>0: max(-0.24, -0.32) = -0.24 (unclipped)
        0.5 * 2.0,  # A<0, rho=2: max(1.0, 0.64) = 1.0 < 1.5, dual clip not active
    ]
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=torch.float64), rtol=1e-6, atol=1e-6)
    # `clipped`: 1 where the clipped term was the larger one. For the dual-clip token the clipped
    # term (0.64) is smaller than the unclipped one (2.5), so the indicator is 0 by the docstring.
    torch.testing.assert_close(clipped, torch.tensor([0, 1, 1, 0, 0, 0, 0], dtype=torch.float64))


def test_ppo_policy_loss_without_dual_clip():
    loss, _ = _ppo([5.0, 0.6], [-0.5, -0.5], clip_low=0.2, clip_high=0.28, dual_clip=None)
    # max(2.5, 0.64) = 2.5 ; max(0.3, 0.4) = 0.4
    torch.testing.assert_close(loss, torch.tensor([0.5 * 5.0, 0.5 * 0.8], dtype=torch.float64),
                               rtol=1e-6, atol=1e-6)


def test_ppo_policy_loss_gradients():
    # d loss / d logp = -A*rho for unclipped tokens, 0 for clipped or dual-clipped ones.
    logp_old = torch.full((4,), LOGP_OLD, dtype=torch.float64)
    logp = (logp_old + torch.log(torch.tensor([1.1, 1.5, 0.6, 5.0], dtype=torch.float64)))
    logp.requires_grad_(True)
    adv = torch.tensor([0.7, 0.4, -0.5, -0.5], dtype=torch.float64)
    loss, _ = ppo_policy_loss(logp, logp_old, adv, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([-0.7 * 1.1, 0.0, 0.0, 0.0], dtype=torch.float64),
                               rtol=1e-6, atol=1e-6)


def test_ppo_policy_loss_bounds_the_log_ratio_so_far_moved_tokens_give_finite_losses_and_gradients():
    """Issue 39: logp = -5, logp_old = -100 (log rho = 95; float32 exp overflows past ~88.7) with dual clip 3
    gave a finite loss (the dual clip's 3 at A = -1) but a NaN gradient (inf * 0), and at A = 0 both NaN. With
    log rho clamped to [-20, 20] (verl's bound), by hand, clip_low 0.2, clip_high 0.28:
      log rho = 95:   A = -1   max(e^20, 1.28) = e^20, then min(e^20, 3) = 3       (dual clip)
                      A = 0    0                                                   (both terms 0)
                      A = 0.5  max(-0.5 e^20, -0.5 * 1.28) = -0.64                 (clip)
      log rho = -95:  A = -1   max(e^-20, 0.8) = 0.8                               (clip)
                      A = 0.5  max(-0.5 e^-20, -0.5 * 0.8) = -0.5 e^-20 ~ -1e-9    (unclipped)
    and the gradient of every token is 0: a clip or the dual clip holds the loss, or rho is at its bound."""
    logp = torch.tensor([-5.0, -5.0, -5.0, -100.0, -100.0], requires_grad=True)
    logp_old = torch.tensor([-100.0, -100.0, -100.0, -5.0, -5.0])
    adv = torch.tensor([-1.0, 0.0, 0.5, -1.0, 0.5])
    loss, clipped = ppo_policy_loss(logp, logp_old, adv, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    close(loss, [3.0, 0.0, -0.64, 0.8, -0.5 * math.exp(-20)])
    close(clipped, [0.0, 0.0, 1.0, 1.0, 0.0])
    loss.sum().backward()
    assert torch.isfinite(logp.grad).all()
    close(logp.grad, [0.0] * 5)


def test_ppo_policy_loss_without_dual_clip_holds_a_far_moved_negative_advantage_token_at_the_bound():
    """No dual clip, A = -1, log rho = 95: max(e^20, 1.28) = e^20 (the bound's), finite, with no gradient."""
    logp = torch.tensor([-5.0], dtype=torch.float64, requires_grad=True)
    logp_old, adv = torch.tensor([-100.0], dtype=torch.float64), torch.tensor([-1.0], dtype=torch.float64)
    loss, _ = ppo_policy_loss(logp, logp_old, adv, clip_low=0.2, clip_high=0.28, dual_clip=None)
    assert loss.item() == pytest.approx(math.exp(20), rel=1e-12)
    loss.sum().backward()
    assert logp.grad.item() == 0.0


# ---------------------------------------------------------------------------------------------
# value_loss
# ---------------------------------------------------------------------------------------------

def test_value_loss_by_hand():
    values = t([1.2, 0.3, 2.3])
    values_old = t([1.0, 1.1, 1.1])
    returns = t([2.0, 0.4, 0.4])
    loss, clipped = value_loss(values, values_old, returns, clip=0.5)
    # token 0: V-V_old = 0.2 inside clip -> V_clip = V ; 0.5*(1.2-2.0)^2 = 0.5*0.64 = 0.32
    # token 1: V-V_old = -0.8 -> -0.5, V_clip = 0.6 ; unclipped (0.3-0.4)^2 = 0.01,
    #          clipped (0.6-0.4)^2 = 0.04 -> 0.5*0.04 = 0.02, clipped
    # token 2: V-V_old = 1.2 -> 0.5, V_clip = 1.6 ; unclipped (2.3-0.4)^2 = 3.61,
    #          clipped (1.6-0.4)^2 = 1.44 -> 0.5*3.61 = 1.805, not clipped
    close(loss, [0.5 * 0.64, 0.5 * 0.04, 0.5 * 3.61])
    close(clipped, [0.0, 1.0, 0.0])


def test_value_clip_fraction_counts_no_token_inside_the_clip_range():
    """verl's compute_value_loss clamps V itself: V_clip = clamp(V, V_old - c, V_old + c). Written as
    V_old + clamp(V - V_old), fp32 gives back V - 1.9e-9 for token [1, 4] (V = -0.025179291, V_old = -0.112712830),
    whose clipped square is then larger by rounding: 0.1 of the tokens read as clipped, all within 0.16 of V_old."""
    values = t([[0.4704992175102234, 1.6563351154327393, 0.5152892470359802, -0.2744353711605072, -2.260566473007202],
                [1.227964162826538, 0.7928141355514526, 0.6231480836868286, -2.15203857421875, -0.025179291144013405]])
    values_old = t([[0.569989800453186, 1.661271572113037, 0.534107506275177, -0.15487557649612427, -2.416511297225952],
                    [1.2031760215759277, 0.8373613357543945, 0.6053600907325745, -2.2159171104431152,
                     -0.11271283030509949]])
    returns = t([[-0.5057262182235718, 0.3849651515483856, -0.21775081753730774, -1.6649214029312134,
                  -0.8054940104484558],
                 [1.1331124305725098, 1.7246016263961792, -1.346042275428772, -0.18473368883132935,
                  -0.03128504380583763]])
    assert float((values - values_old).abs().max()) < 0.5
    loss, clipped = value_loss(values, values_old, returns, clip=0.5)
    close(clipped, [[0.0] * 5, [0.0] * 5])
    close(loss, 0.5 * (values - returns) ** 2)


def test_value_loss_unclipped():
    values = t([1.2, 0.3, 2.3])
    values_old = t([1.0, 1.1, 1.1])
    returns = t([2.0, 0.4, 0.4])
    loss, clipped = value_loss(values, values_old, returns, clip=None)
    # 0.5*(V-R)^2: 0.5*0.64, 0.5*0.01, 0.5*3.61
    close(loss, [0.32, 0.005, 1.805])
    close(clipped, [0.0, 0.0, 0.0])


# ---------------------------------------------------------------------------------------------
# aggregate
# ---------------------------------------------------------------------------------------------

LOSS = [[0.3, -1.2, 5.0], [2.5, 0.4, 1.1], [0.6, 7.0, 7.0]]
MASK = [[1, 1, 0], [1, 1, 1], [1, 0, 0]]
# masked sums per row: -0.9 (2 tokens), 4.0 (3 tokens), 0.6 (1 token); total 3.7 over 6 tokens, 3 rows
EXPECTED = {
    "token-mean": 3.7 / 6,
    "seq-mean-token-sum": 3.7 / 3,
    "seq-mean-token-mean": (-0.9 / 2 + 4.0 / 3 + 0.6 / 1) / 3,
}


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_aggregate_by_hand(mode):
    out = aggregate(t(LOSS), t(MASK), mode)
    assert out.item() == pytest.approx(EXPECTED[mode], abs=1e-6)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_aggregate_micro_batches_sum_to_full_batch(mode):
    loss, mask = t(LOSS), t(MASK)
    full = aggregate(loss, mask, mode, num_tokens=6, num_seqs=3)
    assert full.item() == pytest.approx(EXPECTED[mode], abs=1e-6)
    for split in ([0], [0, 1]):
        rest = [i for i in range(3) if i not in split]
        a = aggregate(loss[split], mask[split], mode, num_tokens=6, num_seqs=3)
        b = aggregate(loss[rest], mask[rest], mode, num_tokens=6, num_seqs=3)
        assert (a + b).item() == pytest.approx(EXPECTED[mode], abs=1e-6)
    # first micro-batch alone, by hand: row 0 only
    a = aggregate(loss[[0]], mask[[0]], mode, num_tokens=6, num_seqs=3)
    by_hand = {"token-mean": -0.9 / 6, "seq-mean-token-sum": -0.9 / 3,
               "seq-mean-token-mean": (-0.9 / 2) / 3}[mode]
    assert a.item() == pytest.approx(by_hand, abs=1e-6)


def test_aggregate_unknown_mode_raises():
    with pytest.raises(ValueError):
        aggregate(t(LOSS), t(MASK), "seq-sum")


# ---------------------------------------------------------------------------------------------
# first_token_weights
# ---------------------------------------------------------------------------------------------

def test_first_token_weights():
    mask = t([[0, 0, 1, 1, 0], [1, 1, 0, 1, 1], [1, 1, 1, 0, 0], [0, 0, 0, 0, 1]])
    w = first_token_weights(mask, 3.0)
    close(w, [[0, 0, 3, 1, 0], [3, 1, 0, 3, 1], [3, 1, 1, 0, 0], [0, 0, 0, 0, 3]])
    w = first_token_weights(mask, 0.25)
    close(w, [[0, 0, 0.25, 1, 0], [0.25, 1, 0, 0.25, 1], [0.25, 1, 1, 0, 0], [0, 0, 0, 0, 0.25]])


# ---------------------------------------------------------------------------------------------
# explained_variance
# ---------------------------------------------------------------------------------------------

def test_explained_variance_perfect_and_constant():
    returns = t([[1.3, -0.4, 2.2], [0.7, 5.0, 5.0]])
    mask = t([[1, 1, 1], [1, 0, 0]])
    # perfect critic on the mask (off-mask values are garbage)
    values = t([[1.3, -0.4, 2.2], [0.7, -9.0, 9.0]])
    assert explained_variance(values, returns, mask) == pytest.approx(1.0, abs=1e-6)
    # constant critic equal to the masked mean (1.3 - 0.4 + 2.2 + 0.7)/4 = 0.95
    const = torch.full_like(returns, 0.95)
    assert explained_variance(const, returns, mask) == pytest.approx(0.0, abs=1e-6)


def test_explained_variance_by_hand():
    returns = t([[1.0, 2.0, 4.5, 8.0]])
    values = t([[1.5, 2.0, 4.0, -3.0]])
    mask = t([[1, 1, 1, 0]])
    # R - V = [-0.5, 0, 0.5]: var = 0.5/3 = 1/6 ; R = [1, 2, 4.5]: mean 2.5, var = (2.25+0.25+4)/3 = 6.5/3
    # EV = 1 - (1/6)/(6.5/3) = 1 - 1/13 = 12/13
    assert explained_variance(values, returns, mask) == pytest.approx(12 / 13, abs=1e-6)


# ---------------------------------------------------------------------------------------------
# approx_kl
# ---------------------------------------------------------------------------------------------

def test_approx_kl_by_hand():
    logp = torch.tensor([-0.9, -2.6, -1.1], dtype=torch.float64)
    logp_old = torch.tensor([-1.2, -2.1, -1.1], dtype=torch.float64)
    # log rho = 0.3, -0.5, 0 ; k3 = (rho - 1) - log rho
    expected = [
        (1.3498588075760032 - 1.0) - 0.3,  # e^0.3 = 1.3498588075760032 -> 0.0498588...
        (0.6065306597126334 - 1.0) + 0.5,  # e^-0.5 = 0.6065306597126334 -> 0.1065306...
        0.0,
    ]
    assert math.exp(0.3) == pytest.approx(1.3498588075760032)
    torch.testing.assert_close(approx_kl(logp, logp_old), torch.tensor(expected, dtype=torch.float64),
                               rtol=1e-6, atol=1e-6)
    assert torch.all(approx_kl(logp, logp_old) >= 0)


def test_approx_kl_bounds_the_log_ratio():
    """log rho = 95 (float32: exp overflows to inf) is clamped to 20, and k3 = (e^20 - 1) - 20 then to 10 (verl's
    bounds, algos/kl.py): finite and no larger than the k3 bound."""
    out = approx_kl(torch.tensor([-5.0]), torch.tensor([-100.0]))
    torch.testing.assert_close(out, torch.tensor([10.0]), rtol=0.0, atol=0.0)


def sampled_row(river_tiny, n_sampled: int) -> Rows:
    """One row whose last `n_sampled` tokens are sampled: input_ids, attention_mask, loss_mask and the
    tiny model's log-probs of them as logp_old (so rho = 1 in the loss)."""
    from horizonrl.learner.scoring import token_logprobs

    tokenizer, model = river_tiny
    ids = torch.tensor([tokenizer.encode("You are on stone 2. THINK: go ACTION: jump right")])
    mask = torch.zeros_like(ids)
    mask[0, -n_sampled:] = 1
    with torch.no_grad():
        logp, _ = token_logprobs(model, ids, torch.ones_like(ids), mask, 1.0)
    return Rows(ids, torch.ones_like(ids), mask, logp_old=logp)


def test_kl_loss_term_adds_beta_times_k3_to_the_reference(river_tiny):
    """actor loss(beta) - actor loss(0) = beta * token-mean k3(logp, logp_ref)."""
    from horizonrl.learner.update import actor_loss_fn

    model = river_tiny[1]
    mb = sampled_row(river_tiny, 5)
    logp, mask = mb.logp_old, mb.loss_mask
    mb = dataclasses.replace(mb, advantages=torch.zeros_like(logp), logp_ref=logp - 0.3 * mask)
    n = float(mask.sum())
    args = (model, 0.2, 0.2, 3.0, 0.0, "token-mean", 1.0)
    plain, _ = actor_loss_fn(*args)(mb, n, 1.0)
    with_kl, parts = actor_loss_fn(*args, kl_loss_coef=0.5)(mb, n, 1.0)
    k3 = math.exp(-0.3) - 1 + 0.3
    assert (with_kl - plain).item() == pytest.approx(0.5 * k3, rel=1e-5)
    assert parts["kl_loss"][0] / parts["kl_loss"][1] == pytest.approx(k3, rel=1e-5)


def test_tis_weights_truncate_the_engine_to_learner_ratio_at_the_cap():
    # logp_old - logp_engine = ln 3, ln 0.5, 0  ->  ratios 3, 0.5, 1  ->  min(ratio, 2) = 2, 0.5, 1
    logp_engine = torch.tensor([-1.0, -2.0, -0.7])
    logp_old = logp_engine + torch.tensor([math.log(3.0), math.log(0.5), 0.0])
    torch.testing.assert_close(tis_weights(logp_old, logp_engine, 2.0), torch.tensor([2.0, 0.5, 1.0]), **TOL)
    torch.testing.assert_close(tis_weights(logp_old, logp_engine, 10.0), torch.tensor([3.0, 0.5, 1.0]), **TOL)


def test_masked_tis_weights_drop_the_tokens_over_the_cap_and_keep_the_exact_ratio_below():
    # ratios 3, 0.5, 1, 2 (ln 2: at the cap, kept)  ->  cap 2: 0, 0.5, 1, 2; cap 10: 3, 0.5, 1, 2
    logp_engine = torch.tensor([-1.0, -2.0, -0.7, -3.0])
    logp_old = logp_engine + torch.tensor([math.log(3.0), math.log(0.5), 0.0, math.log(2.0) - 1e-6])
    torch.testing.assert_close(tis_weights(logp_old, logp_engine, 2.0, "mask"), torch.tensor([0.0, 0.5, 1.0, 2.0]),
                               **TOL)
    torch.testing.assert_close(tis_weights(logp_old, logp_engine, 10.0, "mask"), torch.tensor([3.0, 0.5, 1.0, 2.0]),
                               **TOL)


def test_tis_cap_weights_each_tokens_policy_gradient_term(river_tiny):
    """At rho = 1 (logp == logp_old) the clipped surrogate is -A per token; advantages 1, -2, 0.5 give
    -1, 2, -0.5 (dual clip 3 does not bind: min(2, 6) = 2), token mean 0.5 / 3. Engine log-probs
    ln 3, ln 0.5, 0 below the learner's give weights min(3, 2) = 2, 0.5, 1 (cap 2):
    -2, 1, -0.5, token mean -1.5 / 3 = -0.5; masked, 0, 0.5, 1: 0, 1, -0.5, token mean 0.5 / 3. tis_cap None
    is the plain loss, bit for bit."""
    from horizonrl.learner.update import actor_loss_fn

    model = river_tiny[1]
    mb = sampled_row(river_tiny, 3)
    logp = mb.logp_old
    advantages, gaps = torch.zeros_like(logp), torch.zeros_like(logp)
    advantages[0, -3:] = torch.tensor([1.0, -2.0, 0.5])
    gaps[0, -3:] = torch.tensor([math.log(3.0), math.log(0.5), 0.0])
    mb = dataclasses.replace(mb, advantages=advantages, logp_engine=logp - gaps)
    args = (model, 0.2, 0.2, 3.0, 0.0, "token-mean", 1.0)
    plain, _ = actor_loss_fn(*args)(mb, 3.0, 1.0)
    off, _ = actor_loss_fn(*args, tis_cap=None)(mb, 3.0, 1.0)
    weighted, _ = actor_loss_fn(*args, tis_cap=2.0)(mb, 3.0, 1.0)
    masked, parts = actor_loss_fn(*args, tis_cap=2.0, tis_mode="mask")(mb, 3.0, 1.0)
    assert torch.equal(plain, off)
    assert plain.item() == pytest.approx(0.5 / 3, abs=1e-5)
    assert weighted.item() == pytest.approx(-0.5, abs=1e-5)
    assert masked.item() == pytest.approx(0.5 / 3, abs=1e-5)     # weights 0, 0.5, 1: 0, 1, -0.5 -> 0.5 / 3
    assert parts["rollout/tis_clipped_frac"][0] == pytest.approx(1.0)   # one token of three over the cap
    without_engine = dataclasses.replace(mb, logp_engine=None)
    with pytest.raises(ValueError, match="tis_cap .* engine returns none"):
        actor_loss_fn(*args, tis_cap=2.0)(without_engine, 3.0, 1.0)


def test_entropy_coef_decays_linearly_from_the_first_update_towards_zero():
    # 0.01 over 4 updates: 0.01 x (1, 3/4, 2/4, 1/4)
    assert [entropy_coef_at(0.01, "linear", i, 4) for i in range(1, 5)] == pytest.approx([0.01, 0.0075, 0.005, 0.0025])
    assert [entropy_coef_at(0.01, "constant", i, 4) for i in (1, 4)] == [0.01, 0.01]
    with pytest.raises(ValueError, match="actor.entropy_decay must be constant or linear, got 'cosine'"):
        entropy_coef_at(0.01, "cosine", 1, 4)
