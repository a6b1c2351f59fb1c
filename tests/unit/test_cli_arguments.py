"""Command-line arguments that no command can use are refused where they are parsed (exit 2, naming the
argument), before any work."""

import pytest

from horizonrl.cli import main
from horizonrl.config import SOURCE_CONFIGS

BABYAI = str(SOURCE_CONFIGS / "babyai.yaml")   # Qwen2.5-3B: its config.json ships with horizonrl


@pytest.mark.parametrize("argument,value", [("--gpu-memory-gb", "-5"), ("--gpu-memory-gb", "0"),
                                            ("--gpu-memory-gb", "nan"), ("--seq-len", "-1"), ("--seq-len", "0")])
def test_plan_refuses_a_size_that_is_not_positive(argument, value, capsys):
    """Issue 28: `plan ... --gpu-memory-gb -5` printed "no change makes it fit" and exited 0."""
    with pytest.raises(SystemExit) as exit_:
        main(["plan", BABYAI, "--gpus", "4", argument, value])
    assert exit_.value.code == 2
    assert f"argument {argument}: must be a positive number, got {value}" in capsys.readouterr().err


def test_plan_takes_a_positive_size():
    assert main(["plan", BABYAI, "--gpus", "4", "--gpu-memory-gb", "141", "--seq-len", "2048"]) == 0
