"""`horizonrl`'s one table from error type to exit code (cli.exit_codes): an error the user can fix is exit 2, a
run that failed exit 1, a run a signal stopped 128 + the signal, each one line on stderr; a command's own bad
input is exit 2 for that command alone, and anything else keeps its traceback."""

import signal
from pathlib import Path

import pytest

from horizonrl import cli
from horizonrl.engines.retry import EngineError
from horizonrl.rollout.failures import RolloutsFailed
from horizonrl.train import loop
from horizonrl.runstate.checkpoint import TrainingStopped
from horizonrl.assembly.sync_check import EngineOutOfSync


def failing_train(error: BaseException):
    def train(cfg, progress=True, resume=None):
        raise error
    return train


@pytest.mark.parametrize("error,code", [(EngineError("the engine failed 4 times"), 1),
                                        (RolloutsFailed("every episode of the batch failed"), 1),
                                        (EngineOutOfSync("the hf engine serves other weights"), 1),
                                        (TrainingStopped(Path("runs/toy-1"), 3, signal.SIGTERM), 143)])
def test_a_run_that_fails_or_stops_is_one_line_and_its_code(error, code, monkeypatch, capsys):
    monkeypatch.setattr(loop, "train", failing_train(error))
    assert cli.main(["train", "--quiet"]) == code
    assert capsys.readouterr().err == f"horizonrl: {error}\n"


def test_a_config_error_is_exit_2_in_every_command(capsys):
    for command in (["train", "actor.lr=abc"], ["sft", "actor.lr=abc"], ["plan", "configs/toy.yaml", "actor.lr=abc",
                                                                          "--gpus", "1"]):
        assert cli.main(command) == 2, command
        assert capsys.readouterr().err.startswith("horizonrl: config error:\nactor.lr: "), command


def test_a_value_error_is_bad_input_of_eval_but_a_bug_inside_training(monkeypatch, capsys):
    assert cli.main(["eval", "no/such/run"]) == 2
    assert capsys.readouterr().err.startswith("horizonrl: ")
    monkeypatch.setattr(loop, "train", failing_train(ValueError("a bug")))
    with pytest.raises(ValueError, match="a bug"):
        cli.main(["train", "--quiet"])


def test_resuming_a_folder_that_is_no_run_says_so(tmp_path, capsys):
    assert cli.main(["train", "--resume", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"horizonrl: cannot resume: {tmp_path} is not a run folder (no config.yaml)\n"


@pytest.mark.parametrize("argv", [["train"], ["sft"], ["envs"], ["play", "river"], ["view", "runs/x"],
                                  ["eval", "runs/x"], ["plan", "configs/toy.yaml", "--gpus", "1"],
                                  ["export", "runs/x", "--to", "out"], ["gateway", "builtin:babyai-tiny"]])
def test_every_subcommand_parses_to_its_run_function(argv):
    """(`view RUN` once named its folder argument as the run function's attribute.)"""
    assert cli.parser().parse_args(argv).run_command.__name__ == f"run_{argv[0]}"
