"""Checkpoint files: atomic folders and the run logs cut back to a checkpoint's iteration."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from horizonrl import runfolder
from horizonrl.config import SOURCE_CONFIGS, dump, load_config
from horizonrl.runstate.checkpoint import (DCP_FOLDER, Checkpointer, StopSignals, atomic_folder,
                                        keep_records_through, prepare_resume, resume_config)


def test_a_failed_write_leaves_the_old_folder_and_no_temporary_one(tmp_path):
    folder = tmp_path / "iter_000001"
    with atomic_folder(folder) as tmp:
        (tmp / "a.txt").write_text("old")
    with pytest.raises(RuntimeError), atomic_folder(folder) as tmp:
        (tmp / "a.txt").write_text("new")
        raise RuntimeError("disk full")
    assert (folder / "a.txt").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["iter_000001"]


def test_records_after_the_iteration_and_a_torn_line_are_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"iteration": i, "x": i}) + "\n" for i in (0, 1, 1, 2)]
    path.write_text("".join(lines) + '{"iteration": 3, "x"')
    keep_records_through(path, 2)
    assert path.read_text() == "".join(lines)
    keep_records_through(path, 1)
    assert path.read_text() == "".join(lines[:3])
    keep_records_through(tmp_path / "absent.jsonl", 1)
    assert not (tmp_path / "absent.jsonl").exists()


def a_stopped_run(tmp_path, iteration: int = 1):
    """A run folder as `--resume` finds it: its config.yaml and one complete checkpoint (empty files)."""
    run = tmp_path / "run"
    folder = run / runfolder.CHECKPOINTS / f"iter_{iteration:06d}"
    (folder / DCP_FOLDER).mkdir(parents=True)
    for name in (f"{DCP_FOLDER}/.metadata", "training_state.json", "training_state.safetensors"):
        (folder / name).touch()
    (run / "init").mkdir()
    (run / "config.yaml").write_text(dump(load_config(SOURCE_CONFIGS / "toy.yaml", ["iterations=1"])))
    return run


def test_every_rank_reads_the_resumed_config_while_the_others_do(tmp_path):
    """Under torchrun every rank runs `train --resume RUN key=value` and reads the run's config with the
    overrides at once (issue 28: each rank rewrote config.yaml through one config.yaml.tmp, and about half
    of 4 ranks' attempts failed with FileNotFoundError). Rank 0 alone records them (prepare_resume)."""
    run = a_stopped_run(tmp_path)
    before = (run / "config.yaml").read_text()
    with ThreadPoolExecutor(4) as ranks:
        configs = list(ranks.map(lambda _: resume_config(run, ["iterations=3"]), range(200)))
    assert {cfg.iterations for cfg in configs} == {3}
    assert (run / "config.yaml").read_text() == before and not (run / "config.yaml.tmp").exists()


def test_rank_0_records_the_resume_overrides_once_the_checkpoint_is_found(tmp_path):
    run = a_stopped_run(tmp_path)
    cfg = resume_config(run, ["iterations=3"])
    assert prepare_resume(run, cfg).folder.name == "iter_000001"
    assert load_config(run / "config.yaml", run_folder=True).iterations == 3
    too_few = resume_config(run, ["iterations=0"])
    with pytest.raises(ValueError, match="past iterations=0"):
        prepare_resume(run, too_few)
    assert load_config(run / "config.yaml", run_folder=True).iterations == 3   # a refused resume changes nothing


class SavedIterations:
    """A TrainingState that records which iterations it was saved after."""

    def __init__(self):
        self.saved = []

    def save(self, run_dir, iteration):
        self.saved.append(iteration)
        return run_dir / f"iter_{iteration}"


@pytest.mark.parametrize("save_every,saved", [(3, [3, 6, 7]), (0, [7]), (1, [1, 2, 3, 4, 5, 6, 7])])
def test_a_checkpoint_on_schedule_and_after_the_iteration_that_ends_the_run(tmp_path, save_every, saved):
    """The checkpointer saves and says where; which iteration ends the run (here 7) is the loop's to say."""
    state = SavedIterations()
    checkpointer = Checkpointer(tmp_path, state, load_config(None, [f"save_every={save_every}"]), StopSignals())
    folders = [checkpointer.save_if_due(i, ends_run=i == 7) for i in range(0, 8)]
    assert state.saved == saved
    assert [f.name for f in folders if f is not None] == [f"iter_{i}" for i in saved]
