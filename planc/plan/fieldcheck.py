"""The type and range of every field of the plan file's array records, stated once (`KINDS`, in the
file's field order: `check.FIELDS`), and the two checks made from that statement:

- `fast(record)`: one generated expression, true when the record is a list of the right length
  whose every field is of its kind and inside its bounds: the common record, checked with no call
  per field (a plan holds records by the hundred thousand);
- `slow(record, at)`: the field-by-field check, which raises naming the first field that is wrong
  (`parts[12].inputs[0].nbytes: must be between 0 and ...`); it runs only where `fast` said no, and
  returns the fields as the reader keeps them (a shape as a tuple).

A field's bounds are numbers, or names that `Fields.bind` takes from the plan being read (the size of
a table an index points into, the slot's bytes). `fast` may refuse what `slow` accepts (an `add`
other than 0.0 is checked by `slow` alone); it never accepts what `slow` refuses. Checks that relate
a record to others (a part's bytes to its tensor's, a copy to its slot) stay in `planc.plan.check`.
"""

from __future__ import annotations

from ..base.dtypes import DTYPES
from ..base.formats import FORMATS
from ..base.limits import MAX_BLOCK, MAX_DIM, MAX_DIMS
from ..base.units import MAX_BYTES
from ..manifest.ggml_types import QUANTIZED
from .checkbase import _addend, _bad, _dtype, _int, _list, _one_of, _shape, _shown, _str
from .records import KERNEL_OPS, OPS, PATHS, SPACES

_MAX = MAX_BYTES
MAX_HEAD_ROWS = 1 << 16  # a part's or kernel's `unpermute` (rows per attention head) beyond this is not a real one
GGML = ("", *sorted(QUANTIZED))  # a part's `ggml`: a GGML block type, or none
ROLES = ("weight", "scale", "scale2")

# kind, then its bounds: ("int", lo, hi) | ("int?", lo, hi) (or null) | ("int*", lo, hi): an int whose
# range depends on other fields, held to [lo, hi] by `fast` and left to `planc.plan.check` by `slow`,
# so that its message states the range of its case | ("in", allowed) | ("dtype",) | ("str",) |
# ("bool",) | ("list", min length, max length) | ("shape",) | ("add",): a float32 constant
NAT = ("int", 0, _MAX)
KINDS = {
    "tensor": (("name", ("str",)), ("dtype", ("dtype",)), ("shape", ("shape",)), ("offset_bytes", NAT),
               ("nbytes", NAT)),
    "part": (("tensor_index", ("int", 0, "tensors-1")), ("index", NAT), ("op", ("in", OPS)), ("path", ("in", PATHS)),
             ("reason_index", ("int", 0, "reasons-1")), ("inputs", ("list", 1, 3, "inputs")), ("offset_bytes", NAT),
             ("out_bytes", NAT), ("out_dtype", ("dtype",)), ("landing_bytes", NAT), ("host_bytes", NAT),
             ("block", ("int", 0, MAX_BLOCK)), ("zero_bytes", NAT), ("ggml", ("in", GGML)), ("add", ("add",)),
             ("unpermute", ("int", 0, MAX_HEAD_ROWS)), ("dst_offset", NAT)),
    "input": (("role", ("in", ROLES)), ("source_index", ("int", 0, "sources-1")), ("file_index", ("int", 0, "files-1")),
              ("start", NAT), ("nbytes", NAT), ("dtype", ("dtype",)), ("shape", ("shape",)), ("seg", NAT),
              ("stride", NAT), ("count", ("int", 1, _MAX))),
    "request": (("file_index", ("int", 0, "files-1")), ("offset", NAT), ("length", ("int", 1, "slot")),
                ("copies", ("list", 0, None)), ("scatter", ("bool",)), ("staging", ("int*", -1, "staging-1")),
                ("width", ("int*", 1, 8)), ("stride", NAT), ("count", ("int*", 1, "slot"))),
    "copy": (("slot_offset", ("int", 0, "room")), ("space", ("in", SPACES)), ("dst_offset", NAT),
             ("nbytes", ("int", 1, "room")), ("rows", ("int", 1, "room")), ("pitch", ("int*", 0, "room"))),
    "kernel": (("part", NAT), ("op", ("in", KERNEL_OPS)), ("src_dtype", ("dtype",)), ("dst_dtype", ("dtype",)),
               ("src_space", ("in", SPACES)), ("src_offset", NAT), ("scale_offset", ("int?", 0, _MAX)),
               ("dst_offset", NAT), ("numel", NAT), ("rows", NAT), ("cols", NAT), ("block", ("int", 0, MAX_BLOCK)),
               ("more", ("list", 0, None)), ("format", ("in", FORMATS)), ("add", ("add",)),
               ("unpermute", ("int", 0, MAX_HEAD_ROWS))),
    "host_part": (("part", NAT), ("dst_offset", NAT), ("copies", NAT)),
}


def _bound(b, env: dict) -> int | None:
    """A bound: a number, a name of `env` (its value), or "name-1" (its value less one)."""
    if b is None or type(b) is int:
        return b
    if b.endswith("-1"):
        return env[b[:-2]] - 1
    return env[b]


class Fields:
    """One record kind's checks (see the module's docstring), for the plan `bind` was given."""

    def __init__(self, record: str, names):
        self.record, self.spec = record, KINDS[record]
        if [n for n, _ in self.spec] != list(names):
            raise AssertionError(f"fieldcheck.KINDS[{record!r}] does not list the file's fields {list(names)}")

    def bind(self, **env) -> "Fields":
        """The checks with this plan's bounds (`env`: the names the kinds use) in place."""
        b = Fields.__new__(Fields)
        b.record, b.spec = self.record, self.spec
        b.kinds = [(name, kind[0], *[_bound(x, env) if kind[0] in ("int", "int?", "int*", "list") and j < 2 else x
                                     for j, x in enumerate(kind[1:])]) for name, kind in self.spec]
        b._fast = None
        return b

    @property
    def fast(self):
        """`fast(r)` for these bounds, compiled on first use (a binding for `slow` alone compiles nothing)."""
        if self._fast is None:
            self._fast = _compile(self.record, self.kinds)
        return self._fast

    def slow(self, r, at: str) -> list:
        """The fields of record `r` at field path `at`, each checked in turn; the first that is wrong
        raises, naming it."""
        _list(r, at, len(self.kinds))
        out = []
        for v, (name, kind, *b) in zip(r, self.kinds):
            path = f"{at}.{name}"
            if kind == "int":
                v = _int(v, path, b[0], b[1])
            elif kind == "int*":
                if type(v) is not int:
                    raise _bad(path, f"must be an integer, got {_shown(v)}")
            elif kind == "int?":
                v = None if v is None else _int(v, path, b[0], b[1])
            elif kind == "in":
                v = _one_of(v, path, b[0])
            elif kind == "dtype":
                v = _dtype(v, path)
            elif kind == "str":
                v = _str(v, path)
            elif kind == "bool":
                if type(v) is not bool:
                    raise _bad(path, f"must be true or false, got {_shown(v)}")
            elif kind == "list":
                _list(v, path)
                if not b[0] <= len(v) <= (len(v) if b[1] is None else b[1]):
                    raise _bad(path, f"must list {b[0]} to {b[1]} {b[2] if len(b) > 2 else 'items'}, got {len(v)}")
            elif kind == "shape":
                v = _shape(v, path)
            elif kind == "add":
                v = _addend(v, path)
            out.append(v)
        return out


def _compile(record: str, kinds: list):
    """`fast(r)` for `kinds`: one expression over the record's fields."""
    terms, env = [], {"DTYPES": DTYPES, "MAX_DIMS": MAX_DIMS}
    for i, (_, kind, *b) in enumerate(kinds):
        x = f"r[{i}]"
        if kind in ("int", "int*"):
            terms.append(f"type({x}) is int and {b[0]} <= {x} <= {b[1]}")
        elif kind == "int?":
            terms.append(f"({x} is None or (type({x}) is int and {b[0]} <= {x} <= {b[1]}))")
        elif kind == "in":
            env[f"A{i}"] = frozenset(b[0])
            terms.append(f"type({x}) is str and {x} in A{i}")
        elif kind == "dtype":
            terms.append(f"type({x}) is str and {x} in DTYPES")
        elif kind == "str":
            terms.append(f"type({x}) is str")
        elif kind == "bool":
            terms.append(f"type({x}) is bool")
        elif kind == "list":
            hi = f" <= {b[1]}" if b[1] is not None else ""
            terms.append(f"type({x}) is list and {b[0]} <= len({x}){hi}")
        elif kind == "shape":  # its dims: checked where the shape is used (`check._shape`)
            terms.append(f"type({x}) is list and len({x}) <= MAX_DIMS")
        elif kind == "add":
            terms.append(f"type({x}) is float and {x} == 0.0")
    src = (f"def fast_{record}(r):\n    return type(r) is list and len(r) == {len(kinds)} and "
           + " and ".join(f"({t})" for t in terms) + "\n")
    exec(compile(src, f"<fieldcheck {record}>", "exec"), env)
    return env[f"fast_{record}"]


def shape_ok(v) -> bool:
    """Whether a shape list that `fast` let through has every dim an int in range (else `slow`'s
    `_shape` names the dim)."""
    return not v or (all(type(d) is int for d in v) and min(v) >= 0 and max(v) <= MAX_DIM)
