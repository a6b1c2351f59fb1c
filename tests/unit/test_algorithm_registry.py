"""The algorithm registry (algos/registry.py): one row per name the config accepts, each fact consistent with
what the trainer does with it, and an unknown name refused with the list of names."""

import typing

import pytest

from horizonrl.algos.group import ESTIMATORS
from horizonrl.algos.registry import ALGORITHMS, REGISTRY, Batches, algorithm
from horizonrl.config import ConfigError, TrainConfig, load_config

TOY = "configs/toy.yaml"


def test_the_config_accepts_exactly_the_registered_names():
    assert typing.get_args(TrainConfig.model_fields["algorithm"].annotation) == ALGORITHMS
    assert ALGORITHMS == ("ppo", "grpo", "dr_grpo", "rloo", "reinforce_pp", "gigpo", "rae")


def test_an_unknown_name_is_one_error_listing_the_names():
    with pytest.raises(ValueError, match="unknown algorithm 'a2c'; the algorithms: ppo, grpo, dr_grpo, rloo, "
                                         "reinforce_pp, gigpo, rae"):
        algorithm("a2c")
    with pytest.raises(ConfigError, match="^algorithm: "):
        load_config(TOY, ["algorithm=a2c"])


@pytest.mark.parametrize("name", ALGORITHMS)
def test_each_row_names_a_way_to_compute_its_advantages(name):
    """Streams are GAE's (a critic); a group row has an outcome estimator of algos/group.py, step credit
    (gigpo, whose estimator gigpo.norm picks) or a role's baseline (rae)."""
    spec = algorithm(name)
    if spec.batches is Batches.STREAMS:
        assert spec.critic and spec.estimator is None and not spec.step_credit
    elif spec.step_credit or spec.role_baseline:
        assert spec.estimator is None and not spec.critic and not (spec.step_credit and spec.role_baseline)
    else:
        assert spec.estimator in ESTIMATORS and not spec.critic
    assert load_config(TOY, [f"algorithm={name}"]).algorithm_spec is REGISTRY[name]


def test_every_estimator_is_an_algorithm():
    assert {spec.estimator for spec in REGISTRY.values()} - {None} == set(ESTIMATORS)

