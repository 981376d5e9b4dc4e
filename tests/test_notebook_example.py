"""docs/example.ipynb runs from top to bottom in a fresh kernel (nbclient, ipykernel), and finds
what its synthetic run holds: stage 2 slow, its waits blamed on rank 2. The notebook checks the
lost-time table against the report itself (an assert in a cell fails the run)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import REPO

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

pytestmark = pytest.mark.slow


def test_example_notebook_executes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the kernel imports this checkout's ppdiag, whatever is installed
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(REPO / "docs" / "example.ipynb", as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "stored with outputs"
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    texts = [
        o.get("data", {}).get("text/plain", "") + o.get("text", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
    ]
    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    joined = "\n".join(texts)
    assert "<ppdiag.Analysis 4 ranks, pp=4, schedule=1f1b, M=8" in joined
    assert "PP003" in joined and "2            imbalance" in joined
