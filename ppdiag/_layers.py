"""The layer order of the package, and a check that no module imports from a layer above it.

Run ``python -m ppdiag._layers``: it prints every offending import (``file:line``) and exits 1, or
exits 0 when the package is clean. ``tests/test_layers.py`` runs it.

Layers, lowest first. A module may import its own layer and any layer below, never one above.
Imports are read with :mod:`ast`, so an import inside a function (a lazy import) counts as much as
one at the top. A module belongs to the layer of the longest prefix listed for it (``ppdiag.cli``
holds every command, ``ppdiag.cli.whatif`` included, while ``ppdiag.whatif`` sits lower).

Besides the order, one import from another package of a name that starts with ``_`` is refused:
a private helper that two packages need belongs in a shared module (e.g. :mod:`ppdiag.cli.support`).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

# (layer name, module prefixes). Why each sits where it does:
# - base: no ppdiag imports beyond each other (errors, limits, atomic file writes, the version, the
#   recording helper).
# - model: the columnar run model, its interval algebra, and the Diagnosis container every later
#   layer fills or reads.
# - parsers: trace formats -> model.
# - simulate: schedule simulator and closed forms; the demo recorder only needs the model and the
#   simulator, so it sits here and cannot reach the analysis. ``ppsynth`` (the synthetic traces the
#   tests and benchmarks write) lives outside the package, at the repository root, but is held to
#   the same place: ``check(ppsynth dir)`` refuses any import of it above the simulator.
# - pipeline: stages, micro-batches, schedule, matched transfers, clocks (uses the simulator's
#   schedule tables).
# - attribution: lost time split into causes.
# - whatif: prediction of other configurations from the measured costs (its CLI is in ``cli``).
# - facts: facts shared by rules, gate and reports, computed once (summary, facts).
# - rules: findings PP001... (each with its evidence type); ``report_schema`` writes the report's
#   schema with every rule's evidence, so it sits with them.
# - analysis: what an analysis keeps beside its report (AnalysisContext), read by the reports; it
#   sits beside api but below the reports.
# - reports: terminal, JSON, Markdown, HTML, Perfetto, diff, gate.
# - api: the analyze() orchestration (parse -> pipeline -> attribution -> rules).
# - cli: the typer commands (ppdiag/cli/, one module per command), and the notebook API beside
#   them (the same call into api).
# - package: ``ppdiag`` itself, whose ``ppdiag.analyze`` is the notebook API (imported on first use).
#   Only the package root sits here: a module not listed above has no layer and may import nothing
#   of ppdiag, so a new module must be placed in the list.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "base",
        (
            "ppdiag.version",
            "ppdiag.compat",
            "ppdiag.errors",
            "ppdiag.limits",
            "ppdiag.io",
            "ppdiag._layers",
            "ppdiag.recording",
            "ppdiag.cachedir",
            "ppdiag.options",
        ),
    ),
    (
        "model",
        (
            "ppdiag.model",
            "ppdiag.diagnosis",
            "ppdiag.report_types",
            "ppdiag.report_evidence",
            "ppdiag.report_sections",
            "ppdiag.report_check",
            "ppdiag.report_text",
            "ppdiag.report_shares",
        ),
    ),
    ("parsers", ("ppdiag.parsers",)),
    ("simulate", ("ppdiag.simulate", "ppsynth", "ppdiag.demo")),
    ("pipeline", ("ppdiag.pipeline",)),
    ("attribution", ("ppdiag.attribution",)),
    ("whatif", ("ppdiag.whatif",)),
    ("facts", ("ppdiag.summary", "ppdiag.facts")),
    ("rules", ("ppdiag.rules", "ppdiag.report_schema")),
    ("analysis", ("ppdiag.analysis",)),
    ("reports", ("ppdiag.reports",)),
    ("api", ("ppdiag.api", "ppdiag.result_cache")),
    (
        "cli",
        ("ppdiag.cli", "ppdiag.__main__", "ppdiag.notebook"),
    ),
    ("package", ("ppdiag",)),
)

#: Imports the layer order allows but the design does not: (importer, imported, why). The reports
#: render the typed report and the analysis context; what the pipeline and the attribution know
#: reaches them through those, computed once, never recomputed by a reporter.
FORBIDDEN: tuple[tuple[str, str, str], ...] = (
    (
        "ppdiag.reports",
        "ppdiag.pipeline",
        "reports only render: pipeline facts come in the report or context",
    ),
    (
        "ppdiag.reports",
        "ppdiag.attribution",
        "reports only render: attribution facts come in the report or context",
    ),
)

_RANK: dict[str, int] = {p: i for i, (_, prefixes) in enumerate(LAYERS) for p in prefixes}


def layer_of(module: str) -> int:
    """Index in :data:`LAYERS` of ``module`` (longest listed prefix wins); ``-1`` if not ppdiag.
    The package root's layer is its own alone (an unlisted ``ppdiag.x`` has none); ``ppsynth``'s
    covers its submodules."""
    parts = module.split(".")
    shortest = 2 if parts[0] == "ppdiag" and len(parts) > 1 else 1
    for n in range(len(parts), shortest - 1, -1):
        rank = _RANK.get(".".join(parts[:n]))
        if rank is not None:
            return rank
    return -1


def _package(module: str) -> str:
    """First two components: ``ppdiag.reports.md`` -> ``ppdiag.reports``."""
    return ".".join(module.split(".")[:2])


@dataclass(frozen=True)
class Violation:
    """One import that breaks the layer order (or reaches for another package's private name)."""

    path: Path
    line: int
    importer: str
    imported: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} imports {self.imported}: {self.why}"


def _module_name(path: Path, root: Path) -> tuple[str, str]:
    """(module name, package the module's relative imports resolve against)."""
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def _imports(tree: ast.AST, package: str) -> list[tuple[int, str, list[str]]]:
    """(line, absolute module, imported names) for every import in ``tree``, lazy ones included."""
    out: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name, []) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names = [a.name for a in node.names]
            out.append((node.lineno, mod, names))
    return out


def check(root: Path | None = None) -> list[Violation]:
    """Every layer violation under ``root`` (the ``ppdiag`` package directory by default; the
    ``ppsynth`` directory beside it is checked the same way)."""
    root = root or Path(__file__).resolve().parent
    found: list[Violation] = []
    for path in sorted(root.rglob("*.py")):
        module, package = _module_name(path, root)
        own = layer_of(module)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, imported, names in _imports(tree, package):
            if not (imported == "ppdiag" or imported.startswith("ppdiag.")):
                continue
            # `from ppdiag.x import y` may name a submodule y: then it imports ppdiag.x.y
            other = max([layer_of(imported)] + [layer_of(f"{imported}.{n}") for n in names if n != "*"])
            if other > own:
                why = f"layer {LAYERS[other][0]!r} is above {LAYERS[own][0]!r}"
                found.append(Violation(path, line, module, imported, why))
            found += _forbidden(path, line, module, imported, names)
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private and _package(imported) != _package(module):
                why = f"private name(s) {', '.join(private)} of another package"
                found.append(Violation(path, line, module, imported, why))
    return found


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _forbidden(path: Path, line: int, module: str, imported: str, names: list[str]) -> list[Violation]:
    """The :data:`FORBIDDEN` imports of one import statement."""
    targets = [imported, *(f"{imported}.{n}" for n in names if n != "*")]
    return [
        Violation(path, line, module, imported, why)
        for importer, banned, why in FORBIDDEN
        if _within(module, importer) and any(_within(t, banned) for t in targets)
    ]


def main(argv: list[str] | None = None) -> int:
    """Print the violations, one a line; 1 if any, else 0."""
    del argv
    bad = check()
    for v in bad:
        print(v)
    if not bad:
        print(f"ppdiag layers ok: {' -> '.join(name for name, _ in LAYERS)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
