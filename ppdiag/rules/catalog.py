"""The texts ``ppdiag rules`` prints, read from the source of the rule modules without importing them.

Importing the rules loads the whole analysis (numpy, the pipeline, the attribution), several times
the cost of the command itself. Every built-in rule is a class with literal ``code``, ``name``
and ``summary`` attributes, a ``cause`` (a :class:`ppdiag.report_types.Cause` member or None; a
rule whose findings take their cause from the run says so in ``cause_note``) and a docstring,
registered by its module with ``register(TheRule())``; this module reads those from the syntax
tree, and the cause definitions from ``ppdiag/diagnosis.py`` the same way. Anything it cannot
read statically (a computed text, a missing source file) makes it import the rules instead, so
the output is the same either way (``tests/test_lazy_imports.py`` compares both).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from msgspec import Struct

_FIELDS = ("code", "name", "cause", "summary")


@dataclass(frozen=True)
class RuleText:
    """What ``ppdiag rules`` shows of one rule."""

    code: str
    name: str
    cause: str | None  # the rule's cause key, or its ``cause_note``; None: a configuration rule
    summary: str
    doc: str  # the class docstring, cleaned like inspect.cleandoc
    evidence: tuple[tuple[str, str], ...] = ()  # the rule's own evidence fields: (name, type)


class _NotStatic(Exception):
    """The source does not give the texts as literals."""


def rule_texts() -> list[RuleText]:
    """Every built-in rule, by code."""
    try:
        return _static_rules()
    except (OSError, SyntaxError, ValueError, _NotStatic):
        return _imported_rules()


def cause_texts() -> list[tuple[str, str]]:
    """Each cause of the counterfactual chain, in chain order, with its definition."""
    try:
        return _static_causes()
    except (OSError, SyntaxError, ValueError, _NotStatic):
        from ppdiag.diagnosis import CAUSE_CHAIN, CAUSE_DEFINITIONS

        return [(k, CAUSE_DEFINITIONS[k]) for k in CAUSE_CHAIN]


#: The four sections of every rule's docstring, in order.
SECTIONS = ("What it detects", "Why it matters", "How to fix", "Example")


def sections_of(doc: str) -> dict[str, str]:
    """The text under each of :data:`SECTIONS` in a rule's docstring (lines joined as written)."""
    out: dict[str, str] = {}
    heads = [(doc.find(f"{h}:"), h) for h in SECTIONS if f"{h}:" in doc]
    heads.sort()
    for (at, head), nxt in zip(heads, [*heads[1:], (len(doc), "")], strict=True):
        out[head] = doc[at + len(head) + 1 : nxt[0]].strip()
    return out


def catalog_markdown() -> str:
    """``docs/rules.md``: every rule's code, name, cause, summary and the four sections of its
    docstring (what ``ppdiag rules CODE`` prints), generated from the rule modules."""
    texts = rule_texts()
    out = [
        "# Rules",
        "",
        "Every finding ppdiag reports comes from one rule. `ppdiag rules` lists them and",
        "`ppdiag rules CODE` prints one; this page holds the same text, generated from the rule",
        "modules (`ppdiag/rules/pp*.py`): after changing a rule, regenerate it with",
        "`PPDIAG_UPDATE_SNAPSHOTS=1 python3 -m pytest tests/test_rule_golden.py -k documented`.",
        "A finding's cause is one of the lost-time causes of the report (`lost_ms` in [json.md](json.md)).",
        "A finding's `evidence` is its rule's own typed object (the fields listed under each rule, in",
        "the order the JSON holds them), followed by the fields every finding's evidence ends with:",
        "`noise_ms`, `steps_used`, `oversubscribed_host` (only when true), and with a what-if fix",
        "`whatif_fix` and `whatif_step_ms`.",
        "",
        "| code | name | cause | summary |",
        "|---|---|---|---|",
    ]
    out += [f"| {t.code} | {t.name} | {t.cause or '-'} | {t.summary} |" for t in texts]
    for t in texts:
        out += ["", f"## {t.code} {t.name}", "", f"Cause: {t.cause or 'none'}. {t.summary}"]
        if t.evidence:
            # an UNSET field is left out of the JSON when the rule has nothing to say
            fields = ", ".join(
                f"`{n}` ({ty.replace(' | UnsetType', ', when present')})" for n, ty in t.evidence
            )
            out += ["", f"Evidence: {fields}."]
        for head, body in sections_of(t.doc).items():
            out += ["", f"**{head}.**", "", body]
    return "\n".join(out) + "\n"


def _imported_rules() -> list[RuleText]:
    import inspect

    from ppdiag.rules import RULES, load_builtin

    load_builtin()
    return [
        RuleText(
            r.code,
            r.name,
            getattr(r, "cause_note", None) or (None if r.cause is None else str(r.cause)),
            r.summary,
            inspect.cleandoc(type(r).__doc__ or ""),
            _evidence_fields(r.evidence),
        )
        for r in (RULES[c] for c in sorted(RULES))
    ]


def _evidence_fields(kind: type[Struct]) -> tuple[tuple[str, str], ...]:
    """A rule's own evidence fields (the common ones of its base left out) with their annotations
    as written (the modules use postponed annotations: strings)."""
    import inspect

    own = inspect.get_annotations(kind)
    return tuple((n, str(ty)) for n, ty in own.items() if n in kind.__struct_fields__)


def _static_rules() -> list[RuleText]:
    import ast

    found: dict[str, RuleText] = {}
    for path in sorted(Path(__file__).parent.glob("pp*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        registered = {
            node.value.args[0].func.id
            for node in tree.body
            if isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id == "register"
            and len(node.value.args) == 1
            and isinstance(node.value.args[0], ast.Call)
            and isinstance(node.value.args[0].func, ast.Name)
        }
        classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in registered]
        if len(classes) != len(registered):
            raise _NotStatic(path.name)
        for cls in classes:
            text = _rule_text(cls, tree)
            if text.code in found:
                raise _NotStatic(text.code)
            found[text.code] = text
    if not found:
        raise _NotStatic("no rule modules")
    return [found[c] for c in sorted(found)]


def _rule_text(cls: object, tree: object) -> RuleText:
    import ast

    assert isinstance(cls, ast.ClassDef) and isinstance(tree, ast.Module)
    values: dict[str, object] = {}
    evidence: tuple[tuple[str, str], ...] = ()
    for node in cls.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == "evidence"
            and isinstance(node.value, ast.Name)
        ):
            evidence = _static_evidence(tree, node.value.id)
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in (*_FIELDS, "cause_note")
        ):
            values[node.targets[0].id] = _literal(node.value)
    code, name, cause, summary = (values.get(f, _NotStatic) for f in _FIELDS)
    cause = values.get("cause_note") or cause
    if not (isinstance(code, str) and isinstance(name, str) and isinstance(summary, str)):
        raise _NotStatic(cls.name)
    if cause is not None and not isinstance(cause, str):
        raise _NotStatic(cls.name)
    return RuleText(code, name, cause, summary, ast.get_docstring(cls) or "", evidence)


def _static_evidence(tree: object, name: str) -> tuple[tuple[str, str], ...]:
    """The annotated fields of the class ``name`` of a rule module (its evidence Struct)."""
    import ast

    assert isinstance(tree, ast.Module)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return tuple(
                (n.target.id, ast.unparse(n.annotation))
                for n in node.body
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
            )
    raise _NotStatic(name)


def _literal(node: object) -> object:
    """A literal's value; ``Cause.HOST`` (a member of the cause enum) as its key, ``host``."""
    import ast

    assert isinstance(node, ast.expr)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Cause":
        return node.attr.lower()
    return ast.literal_eval(node)


def _static_causes() -> list[tuple[str, str]]:
    import ast

    tree = ast.parse((Path(__file__).parents[1] / "diagnosis.py").read_text(encoding="utf-8"))
    values: dict[str, object] = {}
    for node in tree.body:
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.value is not None
            and node.target.id in ("CAUSE_CHAIN", "CAUSE_DEFINITIONS")
        ):
            values[node.target.id] = ast.literal_eval(node.value)
    chain, defs = values.get("CAUSE_CHAIN"), values.get("CAUSE_DEFINITIONS")
    if not isinstance(chain, tuple) or not isinstance(defs, dict):
        raise _NotStatic("diagnosis.py")
    out = [(k, defs.get(k)) for k in chain]
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in out):
        raise _NotStatic("diagnosis.py")
    return [(str(k), str(v)) for k, v in out]
