"""The closed set of error codes: one module lists them, errors refuse any other, no module writes one
as a free string, and the docs' table is the module's."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import planc
from planc.base.codes import Code, table
from planc.base.errors import AdmissionError, ManifestError, PlancError, SpecError

PKG = Path(planc.__file__).parent
ROOT = PKG.parent
CODES_PY = Path(__import__("planc.base.codes", fromlist=["Code"]).__file__)


def test_an_unknown_code_is_refused_at_construction():
    with pytest.raises(ValueError, match="spec-sintax"):
        SpecError("x", code="spec-sintax")
    e = SpecError("bad yaml", code="spec-syntax")
    assert e.code is Code.SPEC_SYNTAX and e.code == "spec-syntax" and str(e) == "bad yaml [spec-syntax]"
    assert ManifestError("m").code is Code.MANIFEST and AdmissionError("r").code == "refused"


def test_every_code_has_an_exit_code_and_a_meaning():
    for c in Code:
        assert re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", c.value), c
        assert c.name == c.value.upper().replace("-", "_"), c
        assert c.exit_code in (1, 2, 3, 130, 141), c
        assert c.meaning and not c.meaning.endswith("."), c


def test_every_error_class_default_is_listed():
    def subclasses(cls):
        for s in cls.__subclasses__():
            yield s
            yield from subclasses(s)
    import planc.face.cli  # noqa: F401 - defines the usage error
    import planc.base.outputs  # noqa: F401
    for cls in [PlancError, *subclasses(PlancError)]:
        assert Code(cls.default_code).exit_code == cls.exit_code, cls


def _code_ref(x) -> bool:
    if isinstance(x, ast.Attribute) and x.attr == "code":
        return True
    return (isinstance(x, ast.Call) and isinstance(x.func, ast.Name) and x.func.id == "getattr"
            and len(x.args) > 1 and isinstance(x.args[1], ast.Constant) and x.args[1].value == "code")


def _strs(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, ast.IfExp):
        yield from _strs(node.body)
        yield from _strs(node.orelse)
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for e in node.elts:
            yield from _strs(e)


def _free_codes(path: Path):
    """(line, text) of every error code written as a string in one module."""
    src = path.read_text()
    for m in re.finditer(r"""\b(?:code|\w+_code)\s*=\s*["']""", src):
        if not m.group(0).startswith(("kernel_code", "exit_code")):
            yield src.count("\n", 0, m.start()) + 1, m.group(0)
    tree = ast.parse(src)
    for n in ast.walk(tree):
        if isinstance(n, ast.Compare) and any(_code_ref(x) for x in (n.left, *n.comparators)):
            for x in (n.left, *n.comparators):
                for c in _strs(x):
                    yield c.lineno, c.value
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            pos = n.args.posonlyargs + n.args.args
            pairs = list(zip(pos[len(pos) - len(n.args.defaults):], n.args.defaults))
            pairs += [(a, d) for a, d in zip(n.args.kwonlyargs, n.args.kw_defaults) if d is not None]
            for a, d in pairs:
                if a.arg == "code" or a.arg.endswith("_code"):
                    for c in _strs(d):
                        yield c.lineno, c.value
        elif isinstance(n, ast.Dict):
            for k, v in zip(n.keys, n.values):
                if isinstance(k, ast.Constant) and k.value == "code":
                    for c in _strs(v):
                        yield c.lineno, c.value
        elif isinstance(n, ast.Call):
            f = n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
            if f.endswith(("Error", "Refusal", "_os_error", "_check_unicode", "_stat", "_open")) or f == "Refusal":
                for a in n.args:
                    for c in _strs(a):
                        if c.value in Code._value2member_map_:
                            yield c.lineno, c.value


def _codes_in_messages(path: Path):
    """(line, text) of every `[code]` written into a message (a string or an f-string's text, not a
    docstring): `f"... [node-budget]"` is a free-string code too."""
    tree = ast.parse(path.read_text())
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            for m in re.finditer(r"\[([a-z][a-z0-9-]*)\]", n.value):
                if m.group(1) in Code._value2member_map_:
                    yield n.lineno, m.group(0)


def test_no_free_string_error_code_outside_the_codes_module():
    found = [f"{p.relative_to(ROOT)}:{line}: {text}" for p in sorted(PKG.rglob("*.py")) if p != CODES_PY
             for line, text in [*_free_codes(p), *_codes_in_messages(p)]]
    assert not found, "error codes written as strings (use planc.base.codes.Code):\n" + "\n".join(found)


def test_the_scan_finds_a_free_code(tmp_path):
    p = tmp_path / "m.py"
    p.write_text('raise SpecError("x", code="spec-syntax")\nif e.code == "plan-kind": pass\n'
                 'r = {"code": "node-budget"}\nraise _os_error(p, exc, "missing")\n'
                 'def _bad(path, why, code: str = "plan-invalid"): pass\n')
    assert sorted(t for _, t in _free_codes(p)) == ['code="', "missing", "node-budget", "plan-invalid", "plan-kind"]
    p.write_text('"""A docstring may name [spec-syntax]."""\nsay(f"planc: {m} [node-budget]")\n')
    assert [t for _, t in _codes_in_messages(p)] == ["[node-budget]"]


def test_the_docs_table_is_the_modules():
    doc = (ROOT / "docs" / "reliability.md").read_text()
    begin, end = "<!-- codes:begin -->\n", "<!-- codes:end -->"
    assert begin in doc and end in doc
    assert doc[doc.index(begin) + len(begin):doc.index(end)] == table(), \
        "docs/reliability.md's table of codes differs from planc/base/codes.py: regenerate it (python -m planc.base.codes)"
