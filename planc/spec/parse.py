"""Spec text -> plain data plus a field-path -> line map: the YAML and JSON readers of `spec.py`.

YAML is read with YAML 1.2 booleans: only `true` and `false` (any case of the first letter, or all
capitals) are booleans; `on`, `off`, `yes`, `no`, `y`, `n` are strings, as keys and as values, so
`on: host` and `io.direct: off` mean what they say. Every other implicit type is PyYAML's safe one.

Both readers refuse a key written twice in one mapping (PyYAML and `json` keep the last one
silently), naming both lines. A JSON spec may start with a byte-order mark, as a YAML one may.

The YAML node tree is walked once, before anything is constructed, at most NODE_CAP nodes and
DEPTH_CAP levels as aliases expand it: `&a [*b, *b, ...]` nested a few levels deep expands to
billions of nodes, and an alias inside its own anchor never ends.
"""

from __future__ import annotations

import json
import re
from json import decoder as _jd
from json import scanner as _js
from typing import Any

import yaml

from ..base.errors import SpecError
from ..base.codes import Code

NODE_CAP = 100_000  # YAML nodes once aliases are expanded; bounds the walk below and pydantic's
DEPTH_CAP = 64  # YAML nesting; a spec needs five or six levels
# libyaml when PyYAML has it: the pure-Python scanner takes a second to reach its recursion limit on
# `[[[[...`, libyaml refuses deep nesting at once. Both resolve and construct through the Python
# resolver and constructor, which the subclass below replaces.
_BASE = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_BOOL = "tag:yaml.org,2002:bool"
_BOOL_12 = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")


class SpecLoader(_BASE):
    """PyYAML's safe loader with YAML 1.2 booleans."""


SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL]
    for first, resolvers in _BASE.yaml_implicit_resolvers.items()
}
for _first in "tTfF":
    SpecLoader.yaml_implicit_resolvers.setdefault(_first, []).insert(0, (_BOOL, _BOOL_12))


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def parse_yaml(text: str, path) -> tuple[Any, dict]:
    """(data, {field path tuple: line}); raises SpecError naming the file and the line."""
    try:
        loader = SpecLoader(text)
        try:
            node = loader.get_single_node()
            lines: dict = {}
            if node is None:
                return None, lines
            _walk(node, lines, path)  # before constructing: it refuses alias bombs and duplicate keys
            return loader.construct_document(node), lines
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise SpecError(f"{path}{line}: not valid YAML: {getattr(e, 'problem', None) or e}",
                        code=Code.SPEC_SYNTAX) from None
    except (ValueError, OverflowError, TypeError, RecursionError) as e:
        # Scalars the YAML constructor fails on (a date like 2024-13-45, an int of 5000 digits), deep nesting.
        raise SpecError(f"{path}: not valid YAML: {_clip(str(e) or type(e).__name__)}", code=Code.SPEC_SYNTAX) from None


def _walk(root, lines: dict, path) -> None:
    todo, seen = [(root, ())], 0
    while todo:
        node, loc = todo.pop()
        seen += 1
        if seen > NODE_CAP or len(loc) > DEPTH_CAP:
            what = (f"expands to more than {NODE_CAP:,} YAML nodes (aliases repeating aliases?)" if seen > NODE_CAP
                    else f"nests more than {DEPTH_CAP} levels deep (an alias inside itself?)")
            raise SpecError(f"{path}:{node.start_mark.line + 1}: the spec {what}; write it out plainly",
                            code=Code.SPEC_TOO_LARGE)
        lines.setdefault(loc, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            first: dict = {}
            for k, v in node.value:
                if not isinstance(k, yaml.ScalarNode):
                    continue  # a complex key: refused by the constructor or by validation
                key = (k.tag, k.value)
                if k.tag != "tag:yaml.org,2002:merge":
                    if key in first:
                        where = ".".join(str(x) for x in loc + (k.value,))
                        raise SpecError(f"{path}:{k.start_mark.line + 1}: duplicate key {_clip(where)!r}: "
                                        f"first at line {first[key]}, again at line {k.start_mark.line + 1}; "
                                        f"keep one", code=Code.SPEC_DUPLICATE_KEY)
                    first[key] = k.start_mark.line + 1
                lines[loc + (k.value,)] = k.start_mark.line + 1
                todo.append((v, loc + (k.value,)))
        elif isinstance(node, yaml.SequenceNode):
            todo.extend((v, loc + (i,)) for i, v in enumerate(node.value))


class _Duplicate(Exception):
    pass


def _unique(pairs: list) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        raise _Duplicate
    return d


def parse_json(text: str, path) -> tuple[Any, dict]:
    """(data, {}); a leading byte-order mark is dropped; duplicate keys are refused with both lines."""
    text = text.removeprefix("\ufeff")
    try:
        return json.loads(text, object_pairs_hook=_unique), {}
    except _Duplicate:
        key, a, b = _duplicate_lines(text)
        raise SpecError(f"{path}:{b}: duplicate key {_clip(key)!r}: first at line {a}, again at line {b}; keep one",
                        code=Code.SPEC_DUPLICATE_KEY) from None
    except json.JSONDecodeError as e:
        raise SpecError(f"{path}:{e.lineno}: not valid JSON: {e.msg}", code=Code.SPEC_SYNTAX) from None
    except (ValueError, RecursionError) as e:  # ints past the str-conversion limit, deep nesting
        raise SpecError(f"{path}: not valid JSON: {_clip(str(e) or type(e).__name__)}", code=Code.SPEC_SYNTAX) from None


class _Found(Exception):
    def __init__(self, key: str, first: int, again: int):
        super().__init__(key)
        self.found = (key, first, again)


def _duplicate_lines(text: str) -> tuple[str, int, int]:
    """(key, first line, second line) of the first key written twice in one object. Called only
    on text that parses, so the object walk below trusts its syntax."""
    ws = _jd.WHITESPACE.match

    def line(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    def parse_object(s_and_end, strict, scan_once, *_args):
        s, end = s_and_end
        seen: dict = {}
        end = ws(s, end).end()
        if s[end] == "}":
            return {}, end + 1
        while True:
            key, after = _jd.scanstring(s, end + 1, strict)
            if key in seen:
                raise _Found(key, line(seen[key]), line(end))
            seen[key] = end
            end = ws(s, ws(s, after).end() + 1).end()  # past the colon
            _, end = scan_once(s, end)
            end = ws(s, end).end()
            if s[end] == "}":
                return {}, end + 1
            end = ws(s, end + 1).end()  # past the comma

    ctx = json.JSONDecoder()
    ctx.parse_object = parse_object
    try:
        _js.py_make_scanner(ctx)(text, ws(text, 0).end())
    except _Found as f:
        return f.found
    except (ValueError, RecursionError, IndexError):
        pass
    return "?", 0, 0
