"""Checkpoint files: atomic folders and the run logs cut back to a checkpoint's iteration."""

import json

import pytest

from horizonrl.train.checkpoint import atomic_folder, keep_records_through


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
