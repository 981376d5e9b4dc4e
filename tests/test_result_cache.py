"""The result cache: a re-run of the same inputs with the same flags by the same code is served from
the stored report, byte for byte what the analysis writes, loading no analysis; anything that can
change the result (a trace's bytes, a file added to the run, a flag, the strict check, the code)
misses, and a damaged entry is a miss that is removed."""

from __future__ import annotations

import dataclasses
import inspect
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import REPO, SHARED_TRACES, TEST_DATA
from rich.console import Console
from typer.testing import CliRunner

import ppdiag.api as api
import ppdiag.result_cache as rc
from ppdiag.api import Options, diagnose
from ppdiag.cli import app
from ppdiag.report_types import Report, encode
from ppdiag.reports.json_report import dumps
from ppdiag.reports.md import render_markdown
from ppdiag.reports.terminal import render

RUN = TEST_DATA / "cuda" / "nccl_1f1b_p2_m8_shapes"


def _runner() -> CliRunner:
    """A runner that keeps stderr apart from stdout: click before 8.2 mixes them unless told not
    to (``mix_stderr``, a parameter that 8.2 removed when it began keeping them apart always)."""
    if "mix_stderr" in inspect.signature(CliRunner.__init__).parameters:
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg]
    return CliRunner()


@pytest.fixture
def analyses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the analyses ``ppdiag analyze`` runs (a hit runs none)."""
    calls: list[int] = []
    real = api.diagnose

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "diagnose", counted)
    return calls


def _run(out: Path, *argv: str, md: bool = True) -> tuple[str, str, bytes, bytes]:
    """(stdout, stderr, JSON file, Markdown file) of one ``ppdiag analyze``."""
    js, mdp = out / "r.json", out / "r.md"
    extra = ["--json", str(js)] + (["--md", str(mdp)] if md else [])
    res = _runner().invoke(app, ["analyze", *argv, *extra])
    assert res.exit_code == 0, res.output
    # the "wrote PATH" lines name this run's own output folder
    return res.stdout, res.stderr.replace(str(out), "OUT"), js.read_bytes(), mdp.read_bytes() if md else b""


def _copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ----------------------------------------------------------------------------------------------
# hit, miss and --no-cache write the same bytes
# ----------------------------------------------------------------------------------------------


def _cases() -> list[Any]:
    cases: list[Any] = [
        pytest.param([str(RUN)], id="kineto-2-ranks"),
        pytest.param([str(RUN), "--microbatches", "7", "--schedule", "gpipe"], id="override-warnings"),
        pytest.param([str(TEST_DATA / "gpu_pp_rank0.json")], id="one-file"),
        pytest.param([str(TEST_DATA / "cpu" / "gloo_1f1b_p4_m8_held2ms")], id="gloo-cpu"),
    ]
    for rel in ("kineto/hta_sampled_2rank", "kineto/gloo_cpu_2rank", "nsys/pipit_saxpy_mpi_nsys2022.sqlite"):
        cases.append(
            pytest.param(
                [str(SHARED_TRACES / rel)],
                id=rel,
                marks=pytest.mark.skipif(not (SHARED_TRACES / rel).exists(), reason="shared trace absent"),
            )
        )
    return cases


@pytest.mark.parametrize("argv", _cases())
def test_hit_writes_what_the_analysis_writes(
    argv: list[str], tmp_path: Path, cache_on: Path, analyses: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    outs = []
    for name in ("miss", "hit"):
        (tmp_path / name).mkdir()
        outs.append(_run(tmp_path / name, *argv))
    assert len(analyses) == 1  # the second run was served from the cache
    assert len(list(cache_on.glob("*.report"))) == 1
    monkeypatch.setenv("PPDIAG_NO_CACHE", "1")
    (tmp_path / "off").mkdir()
    outs.append(_run(tmp_path / "off", *argv))
    assert len(analyses) == 2
    assert outs[0] == outs[1] == outs[2]


def test_skipped_traces_and_warnings_are_served_too(
    tmp_path: Path, cache_on: Path, analyses: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _copy_run(RUN, tmp_path / "run")
    (run / "rank2.pt.trace.json.gz").write_bytes(b"\x04\x22\x4d\x18" + b"\0" * 32)  # lz4: skipped
    outs = []
    for name in ("miss", "hit"):
        (tmp_path / name).mkdir()
        outs.append(_run(tmp_path / name, str(run)))
    assert len(analyses) == 1
    assert b"rank2.pt.trace.json.gz" in outs[0][2]  # the report names the skipped trace
    monkeypatch.setenv("PPDIAG_NO_CACHE", "1")
    (tmp_path / "off").mkdir()
    outs.append(_run(tmp_path / "off", str(run)))
    assert outs[0] == outs[1] == outs[2]
    [entry] = cache_on.glob("*.report")
    hit = rc.get(entry.stem)
    assert hit is not None and any("rank2" in s for s in hit.skipped)


def _check(out: Path, *argv: str) -> tuple[int, str, str, bytes, bytes]:
    """(exit code, stdout, stderr, JSON, Markdown) of one ``ppdiag check``."""
    budget = out.parent / "budget.toml"  # one for every run: the gate names it in the report
    budget.write_text(
        "[budget]\nmax_lost_ratio = 0.25\nmax_bubble_excess = 0.05\n[regression]\nstep_pct = 5\n"
    )
    js, mdp = out / "r.json", out / "r.md"
    res = _runner().invoke(
        app, ["check", *argv, "--budget", str(budget), "--json", str(js), "--md", str(mdp)]
    )
    assert res.exit_code in (0, 1, 3), res.output
    err = res.stderr.replace(str(out), "OUT")
    return res.exit_code, res.stdout.replace(str(out), "OUT"), err, js.read_bytes(), mdp.read_bytes()


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param([str(RUN)], id="whole-run"),
        pytest.param([str(RUN / "rank0.pt.trace.json.gz")], id="one-rank-of-two"),  # inconclusive
        pytest.param([str(RUN), "-m", "7"], id="override-warnings"),
    ],
)
def test_check_is_served_and_judges_the_same(
    argv: list[str], tmp_path: Path, cache_on: Path, analyses: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the gate judges the report, the skipped traces, the loader's doubts and the run's coverage
    # evidence: an entry keeps them all, so a served re-run gives the same verdict and files
    outs = []
    for name in ("analyze", "miss", "hit", "baseline"):
        (tmp_path / name).mkdir()
    _run(tmp_path / "analyze", *argv)  # stores the entry that check then reads
    outs.append(_check(tmp_path / "miss", *argv))
    outs.append(_check(tmp_path / "hit", *argv))
    assert len(analyses) == 1
    monkeypatch.setenv("PPDIAG_NO_CACHE", "1")
    (tmp_path / "off").mkdir()
    outs.append(_check(tmp_path / "off", *argv))
    assert len(analyses) == 2
    assert outs[0] == outs[1] == outs[2]
    assert b'"gate"' in outs[0][3]
    base = tmp_path / "baseline" / "base.json"
    base.write_bytes(outs[0][3])
    monkeypatch.delenv("PPDIAG_NO_CACHE")
    (tmp_path / "hit2").mkdir()
    (tmp_path / "off2").mkdir()
    with_base = _check(tmp_path / "hit2", *argv, "--baseline", str(base))
    monkeypatch.setenv("PPDIAG_NO_CACHE", "1")
    assert _check(tmp_path / "off2", *argv, "--baseline", str(base)) == with_base
    assert len(analyses) == 3


def test_html_and_perfetto_run_the_analysis(tmp_path: Path, cache_on: Path, analyses: list[int]) -> None:
    _run(tmp_path, str(RUN))
    res = _runner().invoke(app, ["analyze", str(RUN), "-q", "--html", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    assert len(analyses) == 2  # the HTML report draws the timelines, which the cache does not keep


def test_a_hit_never_writes_over_a_trace(tmp_path: Path, cache_on: Path, analyses: list[int]) -> None:
    run = _copy_run(RUN, tmp_path / "run")
    _run(tmp_path, str(run))
    trace = run / "rank0.pt.trace.json.gz"
    before = trace.read_bytes()
    # a trace is a gzip, not ppdiag's output: refused before the lookup, and by the hit's sources
    res = _runner().invoke(app, ["analyze", str(run), "-q", "--json", str(trace)])
    assert res.exit_code != 0 and trace.read_bytes() == before
    [entry] = cache_on.glob("*.report")
    hit = rc.get(entry.stem)
    assert hit is not None and str(trace) in hit.sources
    from ppdiag.errors import InputError
    from ppdiag.reports import write_result_report

    with pytest.raises(InputError):
        write_result_report("json", hit.report, trace, hit.sources)
    assert trace.read_bytes() == before


# ----------------------------------------------------------------------------------------------
# the key
# ----------------------------------------------------------------------------------------------


def test_key_misses_on_every_input_change(tmp_path: Path, cache_on: Path) -> None:
    run = _copy_run(RUN, tmp_path / "run")
    opts = Options()
    k0 = rc.key_of([run], opts)
    assert k0 is not None and rc.key_of([run], opts) == k0
    # the same bytes count, not the name: another spelling of the same folder is another key (the
    # report quotes the path as given), the same spelling again is the same
    assert rc.key_of([str(run) + "/"], opts) != k0
    # one byte changed, the same size and the same mtime: only the content hash sees it
    t = run / "rank1.pt.trace.json.gz"
    st = t.stat()
    data = bytearray(t.read_bytes())
    data[-9] ^= 0xFF
    t.write_bytes(bytes(data))
    os.utime(t, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert t.stat().st_size == st.st_size and t.stat().st_mtime_ns == st.st_mtime_ns
    k1 = rc.key_of([run], opts)
    assert k1 not in (None, k0)
    # a file that is not a trace name changes nothing; a trace added, here or one level down, does
    (run / "notes.txt").write_text("x")
    assert rc.key_of([run], opts) == k1
    (run / "rank9.json").write_text("{}")
    k2 = rc.key_of([run], opts)
    assert k2 not in (k0, k1)
    (run / "rank9.json").unlink()
    assert rc.key_of([run], opts) == k1
    (run / "sub").mkdir()
    (run / "sub" / "rank0.json").write_text("{}")
    assert rc.key_of([run], opts) not in (k0, k1, k2)


def test_a_report_in_the_run_counts_by_its_name(tmp_path: Path, cache_on: Path) -> None:
    # a report ppdiag wrote into the run folder: the loader names it and reads no further, so a
    # new one over it (other bytes, other mtime) is the same run
    run = _copy_run(RUN, tmp_path / "run")
    _run(tmp_path, str(run), md=False)
    (tmp_path / "r.json").rename(run / "out.json")
    k = rc.key_of([run], Options())
    (run / "out.json").write_bytes((run / "out.json").read_bytes().replace(b'"ranks"', b'"ranks" ', 1))
    assert rc.key_of([run], Options()) == k


def test_an_nsys_report_beside_its_export_counts_by_its_name(tmp_path: Path, cache_on: Path) -> None:
    # the loader reads rank0.sqlite and passes over rank0.nsys-rep: its bytes change nothing, but
    # alone it is the trace, keyed by its bytes
    (tmp_path / "rank0.sqlite").write_bytes(b"SQLite format 3\0")
    rep = tmp_path / "rank0.nsys-rep"
    rep.write_bytes(b"one")
    k = rc.key_of([tmp_path], Options())
    rep.write_bytes(b"two")
    assert rc.key_of([tmp_path], Options()) == k
    (tmp_path / "rank0.sqlite").unlink()
    k1 = rc.key_of([tmp_path], Options())
    rep.write_bytes(b"three")
    assert rc.key_of([tmp_path], Options()) not in (None, k, k1)


@pytest.mark.parametrize(
    "field,value",
    [
        ("pp", 2),
        ("stage_map", "0,1"),
        ("microbatches", 7),
        ("schedule", "gpipe"),
        ("steps", "1:2"),
        ("global_batch", 64),
        ("micro_batch", 2),
        ("tp", 2),
        ("hosts", "1"),
    ],
)
def test_key_misses_on_every_result_option(field: str, value: object, cache_on: Path) -> None:
    assert field in rc.KEYED_OPTIONS
    base = rc.key_of([RUN], Options())
    assert rc.key_of([RUN], Options(**{field: value})) not in (None, base)  # type: ignore[arg-type]


def test_key_ignores_how_the_parse_runs(cache_on: Path, tmp_path: Path) -> None:
    base = rc.key_of([RUN], Options())
    same = Options(jobs=1, progress=True, scheduler="tcp://nowhere:1", nsys_cache_dir=str(tmp_path))
    assert rc.key_of([RUN], same) == base


def test_key_misses_on_the_environment_and_the_code(cache_on: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = rc.key_of([RUN], Options())
    for var in rc.KEYED_ENV:
        with monkeypatch.context() as m:
            m.setenv(var, "7" if var != "PPDIAG_STRICT_CHECK" else "0")
            assert rc.key_of([RUN], Options()) not in (None, base), var
    monkeypatch.setattr(rc, "_SOURCE_VERSION", "another version of the code")
    assert rc.key_of([RUN], Options()) not in (None, base)


def test_key_misses_on_another_install_of_a_library(
    cache_on: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    import ppdiag.cachedir as cachedir
    import ppdiag.parsers.cache as pc

    # a library reinstalled or upgraded: its __init__ is another file (size, mtime), so both caches miss
    monkeypatch.setattr(cachedir, "_RUNTIME", None)
    monkeypatch.setattr(pc, "_VERSION", None)
    base, parse_base = rc.key_of([RUN], Options()), pc.parser_version()
    fake = tmp_path / "numpy" / "__init__.py"
    fake.parent.mkdir()
    fake.write_text("# another numpy\n")
    real_find = importlib.util.find_spec

    def find(name: str, *args: Any) -> Any:
        if name == "numpy":
            return dataclasses.make_dataclass("Spec", ["origin"])(str(fake))
        return real_find(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find)
    monkeypatch.setattr(cachedir, "_RUNTIME", None)
    monkeypatch.setattr(pc, "_VERSION", None)
    assert "numpy=" + str(fake) in cachedir.runtime_identity()
    assert rc.key_of([RUN], Options()) not in (None, base)
    assert pc.parser_version() != parse_base
    # a library that is not installed is named as absent, not an error
    monkeypatch.setattr(cachedir, "RUNTIME_LIBRARIES", ("no_such_library_here",))
    monkeypatch.setattr(cachedir, "_RUNTIME", None)
    assert cachedir.runtime_identity().endswith("no_such_library_here=absent")


def test_no_key_for_urls_missing_paths_or_a_cache_turned_off(
    cache_on: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert rc.key_of(["s3://bucket/run/"], Options()) is None
    assert rc.key_of([RUN / "nope"], Options()) is None
    assert rc.key_of([], Options()) is None
    monkeypatch.setenv("PPDIAG_NO_CACHE", "1")
    assert rc.key_of([RUN], Options()) is None


def test_the_keyed_names_are_the_packages() -> None:
    from ppdiag.parsers import kineto_bytes, nsys_arrow, nsys_db
    from ppdiag.parsers.detect import trace_suffixes
    from ppdiag.parsers.loader import OWN_OUTPUTS
    from ppdiag.report_check import STRICT_ENV

    # the parsers' names, written out in the cache so that a hit loads no parser
    assert set(rc.TRACE_SUFFIXES) == set(trace_suffixes())
    assert rc.OWN_NAMES == OWN_OUTPUTS
    assert {
        STRICT_ENV,
        nsys_arrow.ARROW_ENV,
        nsys_db.SQL_BUDGET_ENV,
        "PPDIAG_MAX_TRACE_GB",
        kineto_bytes.ISAL_ENV,
    } == set(rc.KEYED_ENV)


def test_source_version_hashes_every_module(monkeypatch: pytest.MonkeyPatch) -> None:
    import ppdiag.cachedir as cachedir

    monkeypatch.setattr(rc, "_SOURCE_VERSION", None)
    v = rc.source_version()
    assert v == rc.source_version() and len(v) == 32
    # one module's bytes changed, deep in the package or in the layer a parse never reads: a miss
    real = Path.read_bytes
    for changed in ("rules/pp001_bubble.py", "reports/md.py", "report.schema.json"):
        target = cachedir.package_root() / changed
        assert target.is_file(), changed

        def edited(self: Path, _t: Path = target) -> bytes:
            return real(self) + (b"# edited\n" if self == _t else b"")

        with monkeypatch.context() as m:
            m.setattr(Path, "read_bytes", edited)
            m.setattr(rc, "_SOURCE_VERSION", None)
            assert rc.source_version() != v, changed
    monkeypatch.setattr(rc, "_SOURCE_VERSION", None)
    assert rc.source_version() == v


# ----------------------------------------------------------------------------------------------
# entries
# ----------------------------------------------------------------------------------------------


def _report() -> tuple[Report, rc.Cached]:
    diag = diagnose([RUN], Options(microbatches=7))
    return diag.result, rc.cached_of(diag)


def test_the_entry_gives_back_the_report_exactly(cache_on: Path) -> None:
    report, cached = _report()
    assert report.findings  # evidence of several rules' own types goes through the entry
    assert rc.put("a" * 40, cached)
    hit = rc.get("a" * 40)
    assert hit is not None
    assert hit.report == report  # the rules are loaded here: each evidence is its rule's type
    assert encode(hit.report) == encode(report) and dumps(hit.report) == dumps(report)
    assert hit.overrides == cached.overrides and hit.overrides  # -m 7 disagrees with the trace
    assert hit.sources == cached.sources and len(hit.sources) == 2


def test_without_the_rules_the_entry_renders_the_same(cache_on: Path) -> None:
    # a re-run served by the cache loads no rule: each evidence comes back as a type of its own
    # fields, which must encode and render as the rule's type does
    report, cached = _report()
    bare = rc._unpack(rc._pack(cached), typed=False)
    assert {type(f.evidence).__module__ for f in bare.report.findings} == {"ppdiag.result_cache"}
    assert rc.encode_msgpack(bare.report) == rc.encode_msgpack(report)
    assert dumps(bare.report) == dumps(report)
    assert render_markdown(bare.report) == render_markdown(report)
    assert bare.report.check() == report.check() == []

    def term(r: Report, cleaned: bool = False) -> str:
        con = Console(width=140, record=True, color_system=None, file=open(os.devnull, "w"))  # noqa: SIM115
        render(r, con, cleaned=cleaned)
        text: str = con.export_text()
        con.file.close()
        return text

    # the terminal shows the cleaned report the entry keeps (cleaning decodes by the rules' types)
    assert term(bare.shown, cleaned=True) == term(report)
    assert "evidence: " in term(report)


def test_nan_and_infinities_come_back(cache_on: Path) -> None:
    report, _ = _report()
    odd = msgspec.structs.replace(
        report, summary=msgspec.structs.replace(report.summary, stage_ratio=float("nan"))
    )
    back = rc.decode_msgpack(rc.encode_msgpack(odd))
    assert back.summary.stage_ratio != back.summary.stage_ratio  # NaN, which the JSON form would lose
    assert rc.encode_msgpack(back) == rc.encode_msgpack(odd)


def _damage(entry: Path, how: Callable[[bytes], bytes]) -> None:
    entry.write_bytes(how(entry.read_bytes()))


@pytest.mark.parametrize(
    "how",
    [
        lambda b: b[:-1] + bytes([b[-1] ^ 1]),  # one bit of the body
        lambda b: b[: len(b) // 2],  # cut short
        lambda b: b"not an entry at all",  # foreign
        lambda b: b[:16] + b"\0" * 32 + b[48:],  # the hash itself
    ],
    ids=["bit", "cut", "foreign", "hash"],
)
def test_a_damaged_entry_is_a_miss_and_removed(
    how: Callable[[bytes], bytes], tmp_path: Path, cache_on: Path, analyses: list[int]
) -> None:
    (tmp_path / "a").mkdir()
    first = _run(tmp_path / "a", str(RUN))
    [entry] = cache_on.glob("*.report")
    _damage(entry, how)
    assert rc.get(entry.stem) is None and not entry.exists()
    _damage_again = entry.exists()
    assert not _damage_again
    (tmp_path / "b").mkdir()
    assert _run(tmp_path / "b", str(RUN)) == first
    assert len(analyses) == 2 and entry.exists()  # analysed again and stored again


def test_an_entry_whose_report_fails_its_check_is_a_miss(
    cache_on: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, cached = _report()
    assert rc.put("b" * 40, cached)
    monkeypatch.setattr(Report, "check", lambda self: ["made up"])
    assert rc.get("b" * 40) is None
    assert not (cache_on / ("b" * 40 + ".report")).exists()


def test_a_damaged_parse_entry_warning_is_not_kept(cache_on: Path) -> None:
    from ppdiag.parsers.cache import DAMAGED_NOTE

    report, cached = _report()
    warned = msgspec.structs.replace(
        report, run=msgspec.structs.replace(report.run, warnings=[f"x: {DAMAGED_NOTE} (ValueError: y)"])
    )
    assert not rc.put("c" * 40, dataclasses.replace(cached, report=warned, shown=warned))


def test_cache_info_and_clear_count_reports(tmp_path: Path, cache_on: Path) -> None:
    _run(tmp_path, str(RUN))
    res = _runner().invoke(app, ["cache", "info"])
    assert "result cache: 1 report," in res.stdout, res.stdout
    (cache_on / "notes.report").write_text("not ours")  # not an entry's name: kept
    res = _runner().invoke(app, ["cache", "clear"])
    assert "removed 1 cached report\n" in res.stdout, res.stdout
    assert rc.info() == (0, 0) and (cache_on / "notes.report").exists()


def test_a_cache_that_cannot_be_written_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, analyses: list[int]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv("PPDIAG_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.delenv("PPDIAG_NO_CACHE", raising=False)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert _run(tmp_path / "a", str(RUN)) == _run(tmp_path / "b", str(RUN))
    assert len(analyses) == 2
    if os.geteuid() != 0:  # root writes through a read-only mode
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        monkeypatch.setenv("PPDIAG_CACHE_DIR", str(ro))
        (tmp_path / "c").mkdir()
        assert _run(tmp_path / "c", str(RUN)) == _run(tmp_path / "a", str(RUN))


# ----------------------------------------------------------------------------------------------
# a hit loads no analysis
# ----------------------------------------------------------------------------------------------

ANALYSIS = (
    "numpy",
    "ppdiag.api",
    "ppdiag.parsers",
    "ppdiag.pipeline",
    "ppdiag.attribution",
    "ppdiag.whatif",
    "ppdiag.rules",
    "ppdiag.facts",
    "ppdiag.summary",
)


def test_a_hit_imports_neither_numpy_nor_the_analysis(tmp_path: Path) -> None:
    env = {
        "PYTHONPATH": str(REPO),
        "PATH": "/usr/bin:/bin",
        "PPDIAG_CACHE_DIR": str(tmp_path / "cache"),
        "PPDIAG_STRICT_CHECK": "1",
    }
    code = (
        "import sys\nsys.argv = ['ppdiag', 'analyze', {run!r}, '--json', {out!r}, '--md', {md!r}]\n"
        "from ppdiag.cli import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print('LOADED:' + ' '.join(m for m in {ANALYSIS!r} if m in sys.modules))\n"
    )
    loaded = []
    shown = []
    for name in ("miss", "hit"):
        probe = code.format(run=str(RUN), out=str(tmp_path / f"{name}.json"), md=str(tmp_path / f"{name}.md"))
        proc = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, env=env, check=True
        )
        last = proc.stdout.rstrip("\n").rsplit("\n", 1)[-1]
        assert last.startswith("LOADED:"), proc.stdout + proc.stderr
        loaded.append(set(last.removeprefix("LOADED:").split()))
        shown.append(proc.stdout.rstrip("\n").rsplit("\n", 1)[0].replace(name, "NAME"))
    assert "numpy" in loaded[0] and "ppdiag.api" in loaded[0]  # the probe sees an analysis
    assert loaded[1] == set()
    # the terminal report too, each finding's evidence with its rule's own fields
    assert shown[0] == shown[1] and "evidence: " in shown[0]
    assert (tmp_path / "miss.json").read_bytes() == (tmp_path / "hit.json").read_bytes()
    assert (tmp_path / "miss.md").read_bytes() == (tmp_path / "hit.md").read_bytes()
