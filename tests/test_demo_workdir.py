"""The demo's work folder is removed even when a killed rank's last write lands after the first
removal (a rank sent SIGKILL finishes the write it is in; on a loaded host that came after
``rmtree`` had listed the folder, and an interrupted demo left its folder behind)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ppdiag.demo import recorder


def test_a_write_after_the_first_removal_is_removed_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "ppdiag-demo-x"
    work.mkdir()
    (work / "ranks.log").write_text("log")
    real = shutil.rmtree
    calls: list[int] = []

    def rmtree_then_late_write(path: Path, ignore_errors: bool = False) -> None:
        real(path, ignore_errors=ignore_errors)
        calls.append(1)
        if len(calls) == 1:  # the killed rank's write in flight lands now
            Path(path).mkdir()
            (Path(path) / "rank2.partial").write_text("late")

    monkeypatch.setattr(shutil, "rmtree", rmtree_then_late_write)
    recorder._remove_work(work)
    assert not work.exists()
    assert len(calls) == 2


def test_patience_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder that cannot be removed (here: never) is given up on after the patience."""
    work = tmp_path / "stuck"
    work.mkdir()
    monkeypatch.setattr(shutil, "rmtree", lambda path, ignore_errors=False: None)
    recorder._remove_work(work, patience_s=0.2)
    assert work.exists()
