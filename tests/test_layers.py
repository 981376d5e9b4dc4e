"""The layer order of ppdiag/_layers.py holds for the package, and the check can fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ppdiag._layers import LAYERS, check, layer_of

ROOT = Path(__file__).resolve().parents[1]


def test_package_has_no_back_edges() -> None:
    assert [str(v) for v in check()] == []


def test_synthetic_runs_import_only_the_model_and_the_simulator() -> None:
    """ppsynth (test support at the repository root, not shipped) sits in the simulate layer."""
    assert layer_of("ppsynth.kineto") == layer_of("ppsynth") == layer_of("ppdiag.simulate")
    assert [str(v) for v in check(ROOT / "ppsynth")] == []


def test_module_entry_point_exits_zero() -> None:
    env_path = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "ppdiag._layers"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "layers ok" in proc.stdout


def test_longest_prefix_wins() -> None:
    names = [name for name, _ in LAYERS]
    assert names[layer_of("ppdiag.cli.whatif")] == "cli"
    assert names[layer_of("ppdiag.whatif.costs")] == "whatif"
    assert names[layer_of("ppdiag.model.intervals")] == "model"
    assert layer_of("numpy") == -1


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_check_finds_lazy_relative_and_private_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "ppdiag"
    for init in ("__init__.py", "pipeline/__init__.py", "attribution/__init__.py", "whatif/__init__.py"):
        _write(pkg, init, "")
    _write(pkg, "attribution/intervals.py", "def union(): ...\n")
    # a lazy import inside a function, and a relative one naming a submodule
    _write(
        pkg,
        "pipeline/blocks.py",
        "def f():\n    from ppdiag.attribution.intervals import union\nfrom ..attribution import intervals\n",
    )
    _write(pkg, "cli/__init__.py", "def _fail(): ...\n")
    _write(pkg, "cli/whatif.py", "from ppdiag.cli import _fail\n")  # its own package: allowed
    _write(pkg, "notebook.py", "from ppdiag.cli import _fail\n")
    _write(pkg, "whatif/fine.py", "from ppdiag.attribution import intervals\n")
    got = sorted((v.path.name, v.line, v.imported) for v in check(pkg))
    assert got == [
        ("blocks.py", 2, "ppdiag.attribution.intervals"),
        ("blocks.py", 3, "ppdiag.attribution"),
        ("notebook.py", 1, "ppdiag.cli"),  # same layer, but another package's private name
    ]


def test_reports_import_neither_the_pipeline_nor_the_attribution(tmp_path: Path) -> None:
    """The layer order lets the reports import both; the design does not: they render the typed
    report and the analysis context, and a reporter that recomputes a fact is a second copy of it."""
    pkg = tmp_path / "ppdiag"
    for init in ("__init__.py", "pipeline/__init__.py", "attribution/__init__.py", "reports/__init__.py"):
        _write(pkg, init, "")
    _write(pkg, "pipeline/steps.py", "def host_steps(): ...\n")
    _write(pkg, "attribution/critical_path.py", "def summarize(): ...\n")
    _write(pkg, "reports/gate.py", "from ppdiag.pipeline.steps import host_steps\n")
    _write(pkg, "reports/style.py", "def f():\n    from ppdiag.attribution import critical_path\n")
    _write(pkg, "api.py", "from ppdiag.pipeline.steps import host_steps\n")  # api may
    got = sorted((v.path.name, v.line, v.imported) for v in check(pkg))
    assert got == [
        ("gate.py", 1, "ppdiag.pipeline.steps"),
        ("style.py", 2, "ppdiag.attribution"),
    ]
