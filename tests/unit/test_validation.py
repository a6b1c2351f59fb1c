"""train/validation.py without playing: which iterations validate, and what a resumed run continues from."""

import json

import pytest

from horizonrl.config import SOURCE_CONFIGS, ConfigError, load_config
from horizonrl.runfolder import VALIDATIONS
from horizonrl.train.loop import check_world_size
from horizonrl.train.validation import Validation

CFG = load_config(str(SOURCE_CONFIGS / "babyai_tiny.yaml"), ["validation.every=5", "validation.episodes=4"])


def test_iteration_0_every_fifth_and_the_last_validate(tmp_path):
    validation = Validation(CFG, tmp_path, first_iteration=0)
    assert [i for i in range(13) if validation.due(i, last=i == 12)] == [0, 5, 10, 12]
    assert validation.best is None and (tmp_path / VALIDATIONS).read_text() == ""


def test_a_resumed_run_keeps_the_validations_before_its_first_iteration(tmp_path):
    lines = [{"iteration": i, "success_rate": rate, "envs": {}, "exploitability": {}, "score": rate, "best": best}
             for i, rate, best in ((0, 0.5, True), (5, 0.75, True), (10, 0.25, False), (15, 0.875, True))]
    (tmp_path / VALIDATIONS).write_text("".join(json.dumps(line) + "\n" for line in lines))
    validation = Validation(CFG, tmp_path, first_iteration=15)   # resumed from the checkpoint of iteration 14
    assert validation.best == 0.75    # iteration 15 is played again: its line goes
    assert [json.loads(line)["iteration"] for line in (tmp_path / VALIDATIONS).read_text().splitlines()] == [0, 5, 10]


def test_validation_under_torchrun_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="^validation: plays the policy in one process"):
        check_world_size(CFG, world_size=2)
    check_world_size(CFG, world_size=1)
