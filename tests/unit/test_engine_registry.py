"""The engine registry (engines/registry.py): a builder and a config name per row, the facts the trainer reads,
and an unknown name refused with the list of names."""

import typing

import pytest

from horizonrl.config import ConfigError, RolloutConfig, TrainConfig, load_config
from horizonrl.engines.registry import ENGINES, engine
from horizonrl.rollout.from_config import ENGINE_BUILDERS
from horizonrl.train.loop import check_world_size
from horizonrl.assembly.sync_check import served_by


def test_every_engine_the_config_accepts_has_a_builder():
    assert typing.get_args(RolloutConfig.model_fields["engine"].annotation) == ENGINES == tuple(ENGINE_BUILDERS)


def test_an_unknown_name_is_one_error_listing_the_names():
    with pytest.raises(ValueError, match="unknown engine 'sglang'; the engines: hf, vllm, openai"):
        engine("sglang")
    with pytest.raises(ConfigError, match="^rollout.engine: "):
        load_config(None, ["rollout.engine=sglang"])


def test_errors_name_the_engine_and_a_server_by_its_url():
    assert served_by(TrainConfig()) == "the hf engine"
    cfg = load_config(None, ["rollout.engine=openai", "rollout.openai.base_url=http://10.0.0.7:8000/v1"])
    assert served_by(cfg) == "the openai engine at http://10.0.0.7:8000/v1"


def test_one_server_for_the_job_is_refused_under_torchrun_naming_the_engines_a_rank_can_own():
    cfg = load_config(None, ["rollout.engine=openai", "validation=null"])
    with pytest.raises(ConfigError, match=r"rollout.engine: openai under torchrun .* use hf, vllm \(an engine per "):
        check_world_size(cfg, 2)


def test_a_producer_process_needs_an_engine_that_samples_the_learners_module():
    assert [name for name in ENGINES if engine(name).samples_learner_module] == ["hf"]
    with pytest.raises(ConfigError, match="rollout.async_training.producer: process runs the hf engine"):
        load_config(None, ["rollout.engine=openai", "rollout.async_training.producer=process"])
