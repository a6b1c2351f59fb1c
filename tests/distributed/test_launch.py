"""The torchrun launcher of these tests retries the known transient gloo abort, and nothing else (issue 28:
it retried every failed launch, so an intermittent real bug passed on its second try)."""

from pathlib import Path

import pytest

import launch

FAILS_ONCE = str(Path(__file__).parent / "fails_once.py")


@pytest.mark.parametrize("mode,retried", [("raise", False), ("mismatch", False), ("abort", True)])
def test_only_the_transient_abort_is_retried(tmp_path, monkeypatch, mode, retried):
    monkeypatch.setattr(launch, "RETRY_LOG", tmp_path / "retries.log")
    done = launch.torchrun(2, [FAILS_ONCE, mode, str(tmp_path / "ran")], timeout_s=120)
    assert (done.returncode == 0) == retried, done.stderr[-3000:]
    assert (tmp_path / "retries.log").exists() == retried
