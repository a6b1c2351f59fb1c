"""algos/rae.py: the moving baseline of each role and the advantages against it, worked out by hand."""

import pytest
import torch

from horizonrl.algos.rae import RoleBaselines, rae_advantages


def test_each_role_moves_its_baseline_once_then_centres_its_returns_and_an_absent_role_keeps_its_own():
    """decay 0.9. Role 0: returns 1, -1, 2 (mean 2/3), b = 0.9 * 0.2 + 0.1 * 2/3 = 0.2466667, advantages
    0.7533333, -1.2466667, 1.7533333. Role 1: return 0.5, b = 0.9 * -0.4 + 0.1 * 0.5 = -0.31, advantage 0.81.
    Role 2 plays no episode: its 3.0 stays."""
    advantages, after = rae_advantages(torch.tensor([1.0, 0.5, -1.0, 2.0]), torch.tensor([0, 1, 0, 0]),
                                       torch.tensor([0.2, -0.4, 3.0]), decay=0.9)
    torch.testing.assert_close(after, torch.tensor([0.18 + 0.2 / 3, -0.31, 3.0]))
    torch.testing.assert_close(advantages, torch.tensor([1 - 0.2466667, 0.81, -1 - 0.2466667, 2 - 0.2466667]))


def test_role_baselines_start_at_zero_keep_their_names_and_round_trip_a_checkpoint():
    """decay 0.5: seat0 returns 2, 4 (mean 3) -> b 1.5, advantages 0.5, 2.5; then seat1 joins with -1 -> b -0.5,
    seat0 alone with 1 -> b 0.5 * 1.5 + 0.5 * 1 = 1.25."""
    baselines = RoleBaselines(decay=0.5)
    torch.testing.assert_close(baselines.advantages(torch.tensor([2.0, 4.0]), ["g/seat0", "g/seat0"]),
                               torch.tensor([0.5, 2.5]))
    restored = RoleBaselines(decay=0.5)
    restored.load_state_dict(baselines.state_dict())
    torch.testing.assert_close(restored.advantages(torch.tensor([-1.0, 1.0]), ["g/seat1", "g/seat0"]),
                               torch.tensor([-0.5, -0.25]))
    assert restored.state_dict() == {"g/seat0": 1.25, "g/seat1": -0.5}


def test_a_decay_outside_zero_to_one_is_refused():
    with pytest.raises(ValueError, match=r"decay must be in \[0, 1\)"):
        rae_advantages(torch.ones(1), torch.zeros(1, dtype=torch.long), torch.zeros(1), decay=1.0)
