"""Fixed cost: modules every command loads do not import pandas (≈0.3–0.7 s with pyarrow); only
the op-table reader, built on it, loads it when it runs (the nsys reader no longer uses it).
Checked in a fresh interpreter, since the test session itself has pandas loaded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import REPO, TEST_DATA

from ppsynth.optable import OpTableParams, simulate_optable, write_table

HEAVY = ("pandas", "pyarrow", "scipy")


def _loaded_after(code: str, modules: tuple[str, ...] = HEAVY) -> set[str]:
    """Which of ``modules`` (top-level names) are loaded once ``code`` has run in a new interpreter."""
    probe = f"{code}\nimport sys\nprint('LOADED:' + ' '.join(m for m in {modules!r} if m in sys.modules))\n"
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "PPDIAG_NO_CACHE": "1"},
        check=True,
    )
    last = proc.stdout.rstrip("\n").rsplit("\n", 1)[-1]
    assert last.startswith("LOADED:"), proc.stdout + proc.stderr
    return set(last.removeprefix("LOADED:").split())


def test_loader_and_registry_do_not_import_pandas() -> None:
    code = "import ppdiag.parsers.loader\nfrom ppdiag.parsers import load_builtin\nload_builtin()"
    assert _loaded_after(code) == set()


def test_kineto_analyze_does_not_import_pandas() -> None:
    trace = TEST_DATA / "gpu_pp_rank0.json"
    code = (
        "from ppdiag.parsers.loader import load_run\n"
        "from ppdiag.api import analyze_run\n"
        f"run = load_run([{str(trace)!r}], progress=False, jobs=1)\n"
        "assert run.format == 'kineto'\n"
        "analyze_run(run)"
    )
    assert _loaded_after(code) == set()


def _nsys_parse_code(tmp_path: Path) -> str:
    """A probe's code that writes a small nsys export into ``tmp_path`` and parses it."""
    return (
        "from ppsynth.scenario import make_scenario\n"
        "from ppsynth.nsys import write_nsys\n"
        "from ppdiag.parsers.loader import load_run\n"
        "run = make_scenario('1f1b', pp=2, microbatches=2, steps=1)\n"
        f"assert load_run(write_nsys(run, {str(tmp_path)!r}), progress=False, jobs=1).format == 'nsys'"
    )


def test_nsys_parse_does_not_import_pandas(tmp_path: Path) -> None:
    code = _nsys_parse_code(tmp_path)
    assert _loaded_after(code) == set()


def test_sniffing_loads_the_nsys_reader_only_when_it_parses(tmp_path: Path) -> None:
    # the registry imports every parser to sniff a run's files; the Nsight Systems export reader
    # (~14 ms of imports) is loaded by its first parse only. The probe can fail: nsys.py imported
    # the reader at its top
    reader = ("ppdiag.parsers.nsys_export",)
    trace = TEST_DATA / "gpu_pp_rank0.json"
    code = f"from ppdiag.parsers.loader import load_run\nload_run([{str(trace)!r}], progress=False, jobs=1)"
    assert _loaded_after(code, reader) == set()
    code = _nsys_parse_code(tmp_path)
    assert _loaded_after(code, reader) == set(reader)


def test_op_table_parse_loads_it_when_used(tmp_path: Path) -> None:
    # the probe can fail: the op-table reader is built on pandas (the table is written here, so
    # that only the parse runs in the probe)
    df, _ = simulate_optable(OpTableParams(pp=2, dp=1, microbatches=2, steps=(1,)))
    table = write_table(df, tmp_path / "ops.csv")
    code = f"from ppdiag.parsers.loader import load_run\nload_run([{str(table)!r}], progress=False)"
    assert "pandas" in _loaded_after(code)


def test_import_ppdiag_is_light_and_offers_analyze() -> None:
    # the notebook API is named at the top (ppdiag.analyze) but imported on its first call
    code = "import sys\nimport ppdiag\nassert callable(ppdiag.analyze) and 'ppdiag.api' not in sys.modules"
    assert _loaded_after(code) == set()


# Start-up of the commands that need no analysis: neither numpy (nor what the analysis loads on
# top of it) nor the report encoders. The probe can fail: the rule catalogue used to import every
# rule module, and with them the whole analysis.
STARTUP_HEAVY = ("numpy", "pandas", "pyarrow", "scipy", "plotly", "dask", "msgspec")


def _loaded_by_command(*argv: str) -> set[str]:
    code = (
        f"import sys\nsys.argv = ['ppdiag', *{list(argv)!r}]\nfrom ppdiag.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass"
    )
    return _loaded_after(code, STARTUP_HEAVY)


def test_rules_and_help_do_not_import_the_analysis() -> None:
    for argv in (("rules",), ("rules", "PP009"), ("--help",), ("analyze", "--help"), ("bubble", "--help")):
        assert _loaded_by_command(*argv) == set(), argv


def test_rules_without_options_do_not_import_typer() -> None:
    # typer converts each parameter through pydantic (~0.15 s to import, half of the command's
    # start-up), and typer with every other command module was most of what was left;
    # ``rules [CODE]`` has nothing to parse, so the entry point runs it without them. The probe can
    # fail: the package used to build the typer application on import
    for argv in (("rules",), ("rules", "PP009"), ("rules", "nope")):
        assert (
            _loaded_after(
                f"import sys\nsys.argv = ['ppdiag', *{list(argv)!r}]\nfrom ppdiag.cli import main\n"
                "try:\n    main()\nexcept SystemExit:\n    pass",
                ("pydantic", "typer", "ppdiag.cli.commands", "ppdiag.cli.analyze"),
            )
            == set()
        ), argv


def test_analyze_with_options_does_not_import_pydantic(tmp_path: Path) -> None:
    # typer converts each option through a pydantic TypeAdapter (pydantic ~25 ms to import, the
    # adapters of analyze's options as much again); plain values are converted without it
    # (ppdiag/cli/coercion.py). The probe can fail: every option went through pydantic
    trace = TEST_DATA / "gpu_pp_rank0.json"
    argv = ("analyze", str(trace), "-q", "--json", str(tmp_path / "r.json"), "--jobs", "1", "--pp", "2")
    # batch: defaults of the options' own type (tp: int = 1) converted without it as well
    batch = ("batch", "--global-batch", "64", "--micro-batch", "2", "--pp", "2")
    for args in (argv, ("analyze", "--help"), ("rules", "--help"), batch):
        assert _loaded_by_command_of(args, ("pydantic",)) == set(), args


def test_a_command_imports_no_other_command(tmp_path: Path) -> None:
    # the entry point registers the named command alone (ppdiag/cli/commands.py: app_for); the
    # probe can fail: every command module was imported and converted by typer for any command
    others = (
        "ppdiag.cli.whatif",
        "ppdiag.cli.demo",
        "ppdiag.cli.calc",
        "ppdiag.cli.check",
        "ppdiag.cli.diff",
    )
    trace = TEST_DATA / "gpu_pp_rank0.json"
    for args in (
        ("analyze", str(trace), "-q", "--json", str(tmp_path / "r.json")),
        ("--no-cache", "analyze", "--help"),
    ):
        assert _loaded_by_command_of(args, others) == set(), args
    assert _loaded_by_command_of(("rules", "--help"), ("ppdiag.cli.analyze",)) == set()
    # the full application where no command is named plainly
    assert _loaded_by_command_of(("--help",), others) == set(others)


def _loaded_by_command_of(argv: tuple[str, ...], modules: tuple[str, ...]) -> set[str]:
    code = (
        f"import sys\nsys.argv = ['ppdiag', *{list(argv)!r}]\nfrom ppdiag.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass"
    )
    return _loaded_after(code, modules)


def test_rule_catalogue_read_from_source_matches_the_registered_rules() -> None:
    from ppdiag.rules import catalog

    static_rules = catalog._static_rules()
    assert static_rules == catalog._imported_rules()
    assert len(static_rules) >= 14
    from ppdiag.diagnosis import CAUSE_CHAIN, CAUSE_DEFINITIONS

    assert catalog._static_causes() == [(k, CAUSE_DEFINITIONS[k]) for k in CAUSE_CHAIN]


def test_writing_one_report_imports_that_report_alone() -> None:
    # the HTML report's template engine (~0.1 s) is no part of a run that writes JSON; the probe
    # can fail: every built-in report module used to be imported before writing any one
    code = (
        "from ppdiag.reports import REPORTERS, load_builtin\nload_builtin('json')\n"
        "assert 'json' in REPORTERS and 'html' not in REPORTERS"
    )
    assert _loaded_after(code, ("jinja2", "ppdiag.reports.html")) == set()
