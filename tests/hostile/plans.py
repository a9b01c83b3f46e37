"""The hostile-plan corpus: valid plans, and every edit of their files that planc must refuse or survive.

`build_plans(folder)` writes one tiny checkpoint (with the safetensors package) and three specs, and
compiles three plans from them:

- `mixed`: every record kind of a one-rank plan: pure copies, a same-size conversion in place, a
  conversion into a landing buffer, a transpose, an FP8 dequantization (weight + scale), experts
  stacked through the scatter kernel, and host-path parts (a conversion and a transpose on the host);
- `tp`: rank 1 of 2 of a tensor-parallel spec: a split of dim 1 (a strided input, read by a strided
  request) and an uneven split; `tp-rows`: rank 0 of the same spec with the slice read as whole rows
  (a 2-D copy)
  of dim 0 with `pad: true` (a zero-filled padding region);
- `refused`: `mixed` compiled against a host budget below its peak (it has a refusal).

`mutations(name, doc)` walks every field path of a plan document (`plan.encode`, parsed) and yields
`Mutation`s: a key removed, a value retyped, negated or enlarged (past its region, 2**63), an array
reordered, an entry duplicated or dropped; and the edits that mean something: files (size, mtime,
`..`, an absolute path), budgets, the refusal, the peaks, `fields`, `format`, `kind`. Big arrays are
sampled at their first, middle and last element. tests/test_plan_file.py loads every mutated file:
each must be a `PlanFormatError` naming a field path, or a plan that is safe to run.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import ml_dtypes
import numpy as np
import yaml
from safetensors.numpy import save_file

from planc.compiler.compile import compile_spec

IO = {"workers": 2, "slot": "4KiB", "slots": 4, "run": "16KiB", "merge_gap": "4KiB"}


def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(12)

    def r(shape, dt):
        return (rng.standard_normal(shape) * 0.5).astype(dt)

    out = {
        "copy.a": r((300,), np.float32),
        "copy.b": r((7, 9), np.float16),
        "conv.same": r((64, 16), ml_dtypes.bfloat16),  # -> float16 in place
        "conv.land": r((40, 8), ml_dtypes.bfloat16),  # -> float32 through a landing buffer
        "tr.w": r((12, 20), np.float32),  # transpose on the device
        "fp.w": r((130, 70), np.float32).astype(ml_dtypes.float8_e4m3fn),
        "fp.w_scale_inv": (np.abs(r((2, 1), np.float32)) + 0.5).astype(np.float32),
        "host.c": r((32, 16), ml_dtypes.bfloat16),  # -> float32 on the host
        "host.t": r((10, 6), np.float32),  # transposed on the host
        "tp.col": r((10, 8), np.float32),  # tp: split dim 1 (strided)
        "tp.row": r((9, 5), np.float32),  # tp: split dim 0, padded
    }
    for e in range(6):  # interleaved in the file: each request scatters into both stacks
        out[f"ex.{e}.a"] = r((40,), np.float32)
        out[f"ex.{e}.b"] = r((24,), np.float32)
    return out


MIXED_RULES = [
    {"match": "tp.*", "skip": True},
    {"match": "conv.same", "dtype": "float16"},
    {"match": "conv.land", "dtype": "float32"},
    {"match": "tr.w", "transpose": True},
    {"match": "fp.w", "source_dtype": ["F8_E4M3"], "dequantize": {}, "dtype": "bfloat16"},
    {"match": "host.c", "dtype": "float32", "on": "host"},
    {"match": "host.t", "transpose": True, "on": "host"},
    {"match": "ex.{E}.{W}", "stack": {"into": "ex.{W}", "over": "E"}},
    {"match": "*"},
]
TP_RULES = [
    {"match": "tp.col", "split": {"dim": 1}},
    {"match": "tp.row", "split": {"dim": 0, "pad": True}},
    {"match": "copy.a"},
    {"match": "*", "skip": True},
]


def _spec(folder: Path, name: str, rules, host="64MiB", tp: int | None = None, io=None) -> Path:
    doc = {"checkpoint": "m.safetensors", "device": "cuda:0", "budget": {"host": host}, "io": io or IO, "rules": rules}
    if tp:
        doc["tensor_parallel"] = {"size": tp}
    p = folder / name
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


@dataclass(frozen=True)
class Built:
    folder: Path
    want: dict  # source tensor name -> the array written
    plans: dict  # plan name -> Plan
    specs: dict  # plan name -> spec path


def build_plans(folder: Path) -> Built:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    src = arrays()
    save_file(src, str(folder / "m.safetensors"))
    mixed = _spec(folder, "mixed.yaml", MIXED_RULES)
    plan = compile_spec(mixed)
    assert plan.fits, plan.refusal
    refused = _spec(folder, "refused.yaml", MIXED_RULES, host=plan.peak.host_bytes - 1)
    tp = _spec(folder, "tp.yaml", TP_RULES, tp=2)
    rows = _spec(folder, "tp-rows.yaml", TP_RULES, tp=2, io={**IO, "strided": "rows"})
    plans = {"mixed": plan, "tp": compile_spec(tp, 1), "refused": compile_spec(refused), "tp-rows": compile_spec(rows, 0)}
    assert plans["tp"].fits and not plans["refused"].fits
    # the two ways a row-parallel slice is read: a strided request, and whole rows with a 2-D copy
    assert any(q.stride for r in plans["tp"].runs for q in r.requests)
    assert any(c.rows > 1 for r in plans["tp-rows"].runs for q in r.requests for c in q.copies)
    return Built(folder, src, plans, {"mixed": mixed, "tp": tp, "refused": refused, "tp-rows": rows})


# --------------------------------------------------------------------------- field paths

# The record type of the arrays under each key, so that a path names fields as the file's `fields` do.
RECORD = {"tensors": "tensor", "parts": "part", "inputs": "input", "runs": "run", "requests": "request",
          "copies": "copy", "kernels": "kernel", "host_parts": "host_part", "files": "file"}


def walk(doc, sample: bool = True) -> Iterator[tuple[tuple, str, object]]:
    """(path, text, value) of every node below the root, `text` as the codec names it
    (`runs[0].requests[1].copies[0].slot_offset`). With `sample`, arrays of more than three
    elements are entered at their first, middle and last element only; `fields` is a leaf."""
    fields = doc.get("fields") if isinstance(doc, dict) and isinstance(doc.get("fields"), dict) else {}

    def go(node, path, text, state):
        if isinstance(node, dict):
            for k, v in node.items():
                t = f"{text}.{k}" if text else k
                yield path + (k,), t, v
                if k == "fields" and not path:
                    continue
                child = ("array", RECORD[k]) if k in RECORD and isinstance(v, list) else None
                yield from go(v, path + (k,), t, child)
        elif isinstance(node, list):
            idx = range(len(node))
            if sample and len(node) > 3 and not (state and state[0] == "record"):
                idx = _picks(node, state[1] if state else None)
            for i in idx:
                v = node[i]
                child = None
                if state and state[0] == "array":
                    t, child = f"{text}[{i}]", ("record", state[1])
                elif state and state[0] == "record" and i < len(fields.get(state[1], ())):
                    name = fields[state[1]][i]
                    t = f"{text}.{name}"
                    if name in RECORD and isinstance(v, list):
                        child = ("array", RECORD[name])
                else:
                    t = f"{text}[{i}]"
                yield path + (i,), t, v
                yield from go(v, path + (i,), t, child)

    yield from go(doc, (), "", None)


def _picks(node: list, record: str | None) -> list[int]:
    """First, middle and last; and for parts and requests the first of each kind (op and path; scattered)."""
    out = {0, len(node) // 2, len(node) - 1}
    kinds: dict = {}
    for i, x in enumerate(node):
        if record == "part" and isinstance(x, list) and len(x) > 3:
            kinds.setdefault((str(x[2]), str(x[3])), i)
        elif record == "request" and isinstance(x, list) and len(x) > 4:
            kinds.setdefault(str(x[4]), i)
    return sorted(out | set(kinds.values()))


def path_texts(doc) -> set[str]:
    """Every field path of `doc` (no sampling), and its prefixes: what an error may name."""
    out = {"plan"}
    for _, text, _ in walk(doc, sample=False):
        out.add(text)
    return out


def get(doc, path):
    for k in path:
        doc = doc[k]
    return doc


# --------------------------------------------------------------------------- mutations


@dataclass(frozen=True)
class Mutation:
    id: str  # "<plan>:<field path>:<kind>", or "<plan>:edit:<what>"
    plan: str  # which valid plan it edits
    path: str  # the field path it edits
    kind: str
    apply: Callable[[dict], None]  # edits a copy of the plan document in place
    # For the edits that mean something: "refuse" (a plan error whose message holds `words`),
    # or the exit code `planc run PLAN` must give (0, 2 at the fingerprint check, 3 refused).
    expect: str | int | None = None
    words: tuple[str, ...] = ()

    def mutated(self, doc: dict) -> dict:
        out = json.loads(json.dumps(doc))  # a deep copy, faster than copy.deepcopy
        self.apply(out)
        return out


def _set(path, value):
    def f(doc):
        get(doc, path[:-1])[path[-1]] = value
    return f


def _remove(path):
    def f(doc):
        parent = get(doc, path[:-1])
        if isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent.pop(path[-1])
    return f


def _edit(path, fn):
    def f(doc):
        parent = get(doc, path[:-1])
        parent[path[-1]] = fn(copy.deepcopy(parent[path[-1]]))
    return f


def _retypes(v) -> list[tuple[str, object]]:
    out = []
    if type(v) is not str:
        out.append(("str", str(v)))
    if type(v) is not float:
        out.append(("float", float(v) if type(v) is int and abs(v) < 2**53 else 0.5))
    if type(v) is not bool:
        out.append(("bool", True))
    if v is not None:
        out.append(("null", None))
    if type(v) is not list:
        out.append(("list", [v]))
    if type(v) is not dict:
        out.append(("object", {}))
    return out


def generic(name: str, doc: dict, past: int, *, only=None) -> Iterator[Mutation]:
    """The blind mutations of every (sampled) field path; `only` keeps the paths it accepts.

    A leaf gets three of its six retypes (string, float, bool, null, array, object), the three
    turning along the walk, so that each retype meets every kind of field; a container gets all."""
    for n, (path, text, v) in enumerate(walk(doc)):
        if only is not None and not only(text):
            continue

        def m(kind, apply):
            return Mutation(f"{name}:{text}:{kind}", name, text, kind, apply)

        yield m("remove", _remove(path))
        retypes = _retypes(v)
        if not isinstance(v, (dict, list)):  # a leaf: three of its retypes, in turn along the walk
            retypes = [retypes[(n + k) % len(retypes)] for k in (0, 2, 4) if k < len(retypes)]
        for kind, new in retypes:
            yield m(kind, _set(path, new))
        if type(v) is int:
            yield m("neg", _set(path, -v if v else -1))
            yield m("+1", _set(path, v + 1))
            if n % 2:
                yield m("+4096", _set(path, v + 4096))
            yield m("past", _set(path, v + past))
            yield m("2**63", _set(path, 2**63))
        elif type(v) is bool:
            yield m("not", _set(path, not v))
        elif type(v) is str:
            yield m("edit", _set(path, v + "~"))
        elif type(v) is list and v:
            if len(v) >= 2 and v[::-1] != v:
                yield m("reverse", _edit(path, lambda x: x[::-1]))
            yield m("dup", _edit(path, lambda x: x[:1] + x))
            yield m("drop-first", _edit(path, lambda x: x[1:]))
            if len(v) >= 2:
                yield m("drop-last", _edit(path, lambda x: x[:-1]))
        elif type(v) is dict:
            yield m("extra-key", _edit(path, lambda x: {**x, "extra": 1}))


def read_end(doc) -> int:
    """One past the last file byte that a part of the plan reads (one-file plans)."""
    names = doc["fields"]["input"]
    end = 0
    for p in doc["parts"]:
        for i in p[doc["fields"]["part"].index("inputs")]:
            x = dict(zip(names, i))
            n = (x["count"] - 1) * x["stride"] + x["seg"] if x["count"] > 1 else x["nbytes"]
            end = max(end, x["start"] + n)
    return end


def edits(name: str, doc: dict, refusal: dict | None, replay: Callable) -> Iterator[Mutation]:
    """The edits that mean something, each with the outcome it must have.

    `refusal` is a refusal of the same plan against a smaller budget (to invent one on a fitting
    plan); `replay(budget_host)` is the refusal the replay gives against that host budget."""

    def e(what, path, apply, expect, *words):
        return Mutation(f"{name}:edit:{what}", name, path, "edit", apply, expect, tuple(words))

    f0 = ("checkpoint", "files", 0)
    size = doc["checkpoint"]["files"][0][1]
    fname = doc["checkpoint"]["files"][0][0]
    peak = doc["peak"]
    fits = doc["refusal"] is None
    run = 0 if fits else 3  # what `planc run` gives for a plan that decodes
    # files
    yield e("file-size-below-reads", "checkpoint.files[0].size_bytes", _set(f0 + (1,), read_end(doc) - 1), "refuse",
            "parts[")
    yield e("file-size-zero", "checkpoint.files[0].size_bytes", _set(f0 + (1,), 0), "refuse", "parts[")
    yield e("file-size-negative", "checkpoint.files[0].size_bytes", _set(f0 + (1,), -size), "refuse",
            "checkpoint.files[0].size_bytes")
    yield e("file-size-larger", "checkpoint.files[0].size_bytes", _set(f0 + (1,), size + 4096), 2 if fits else 3)
    yield e("file-mtime", "checkpoint.files[0].mtime_ns", _edit(f0 + (2,), lambda t: t + 1), 2 if fits else 3)
    for what, p in (("dotdot", f"../{fname}"), ("inner-dotdot", f"x/../../{fname}"), ("absolute", f"/{fname}"),
                    ("empty", ""), ("nul", f"{fname}\x00")):
        yield e(f"file-path-{what}", "checkpoint.files[0].path", _set(f0 + (0,), p), "refuse",
                "checkpoint.files[0].path")
    yield e("file-listed-twice", "checkpoint.files", _edit(("checkpoint", "files"), lambda x: x + x[:1]), "refuse",
            "checkpoint.files[1].path")
    yield e("file-renamed", "checkpoint.files[0].path", _set(f0 + (0,), "other.safetensors"), 2 if fits else 3)
    yield e("root-elsewhere", "checkpoint.root", _set(("checkpoint", "root"), "/nonexistent/planc"), 2 if fits else 3)
    # budgets
    yield e("host-budget-negative", "budget.host_bytes", _set(("budget", "host_bytes"), -1), "refuse",
            "budget.host_bytes")
    yield e("device-budget-negative", "budget.device_bytes", _set(("budget", "device_bytes"), -1), "refuse",
            "budget.device_bytes")
    if fits:
        yield e("host-budget-below-peak", "budget.host_bytes", _set(("budget", "host_bytes"), peak["host_bytes"] - 1),
                "refuse", "refusal", "host-budget")
        yield e("device-budget-below-peak", "budget.device_bytes",
                _set(("budget", "device_bytes"), peak["device_bytes"] - 1), "refuse", "refusal", "device-budget")
        yield e("host-budget-at-peak", "budget.host_bytes", _set(("budget", "host_bytes"), peak["host_bytes"]), 0)
        yield e("device-budget-at-peak", "budget.device_bytes",
                _set(("budget", "device_bytes"), peak["device_bytes"]), 0)

        def refuse_consistently(doc, b=peak["host_bytes"] - 1):
            doc["budget"]["host_bytes"] = b
            doc["refusal"] = replay(b)
        yield e("host-budget-below-peak-and-refused", "budget.host_bytes", refuse_consistently, 3)
        if refusal is not None:
            yield e("refusal-invented", "refusal", _set(("refusal",), refusal), "refuse", "refusal", "recorded")
    else:
        yield e("refusal-removed", "refusal", _set(("refusal",), None), "refuse", "refusal", "recorded none")
        for k, v in (("message", "fits"), ("step", "stage:nothing#0"), ("needed_bytes", 0), ("run", 1), ("code", "ok")):
            yield e(f"refusal-{k}", f"refusal.{k}", _set(("refusal", k), v), "refuse", "refusal")
        yield e("host-budget-raised", "budget.host_bytes", _set(("budget", "host_bytes"), 1 << 40), "refuse",
                "refusal", "gives none")
    # peaks
    for k in ("host_bytes", "device_bytes"):
        for what, v in (("+1", peak[k] + 1), ("-1", peak[k] - 1), ("zero", 0)):
            yield e(f"peak-{k}{what}", f"peak.{k}", _set(("peak", k), v), "refuse", "peak")
        yield e(f"peak-{k}-negative", f"peak.{k}", _set(("peak", k), -peak[k]), "refuse", f"peak.{k}")
    # the header
    from planc.plan.check import FORMAT
    for what, v in (("previous", FORMAT - 1), ("next", FORMAT + 1), ("text", str(FORMAT)), ("null", None)):
        yield e(f"format-{what}", "format", _set(("format",), v), "refuse", "plan format")
    yield e("format-removed", "format", _remove(("format",)), "refuse", "plan format")
    for what, v in (("spec", "planc-spec"), ("null", None)):
        yield e(f"kind-{what}", "kind", _set(("kind",), v), "refuse", "no kind: planc-plan")
    yield e("kind-removed", "kind", _remove(("kind",)), "refuse", "no kind: planc-plan")
    yield e("fields-part-swapped", "fields.part", _edit(("fields", "part"), lambda x: [x[1], x[0]] + x[2:]), "refuse",
            "fields")
    yield e("fields-copy-dropped", "fields.copy", _edit(("fields", "copy"), lambda x: x[:-1]), "refuse", "fields")
    yield e("fields-record-removed", "fields", _edit(("fields",), lambda x: {k: v for k, v in x.items() if k != "run"}),
            "refuse", "fields")
    yield e("fields-record-added", "fields", _edit(("fields",), lambda x: {**x, "step": ["id"]}), "refuse", "fields")
    # ids and order
    yield e("tensor-name-repeated", "tensors[1].name",
            _edit(("tensors",), lambda x: [x[0], [x[0][0]] + x[1][1:]] + x[2:]),
            "refuse", "tensors[1].name")
    yield e("tensors-reversed", "tensors", _edit(("tensors",), lambda x: x[::-1]), "refuse", "tensors[1].name")
    yield e("part-listed-twice", "runs[0].parts", _edit(("runs", 0, 0), lambda x: x[:1] + x), "refuse",
            "runs[0].parts[1]")
    if len(doc["runs"]) > 1:
        yield e("runs-swapped", "runs", _edit(("runs",), lambda x: x[::-1]), "refuse", "runs[0]")
    yield e("tp-rank-outside", "tensor_parallel.rank",
            _edit(("tensor_parallel",), lambda x: {**x, "rank": x["size"]}), "refuse", "tensor_parallel.rank")
    for what, v in (("index-text", "cuda:x"), ("newline", "cuda:0\nrm -rf /"), ("cpu", "cpu")):
        yield e(f"device-{what}", "device", _set(("device",), v), "refuse", "device")
    # what nothing trusts: the spec's path, the names of skipped tensors, the explanation of a part
    yield e("spec-path", "spec.path", _set(("spec", "path"), "/elsewhere/spec.yaml"), run)
    yield e("skipped-renamed", "skipped",
            _edit(("skipped",), lambda x: [s + ".renamed" for s in x] + ["\n\x1b[31m"]), run)
    yield e("part-reason", "reasons[0]", _set(("reasons", 0), "a reason\nover two lines"), run)


def _past(doc) -> int:
    """An amount that takes any offset past every region of the plan and past the file."""
    lay = doc["layout"]
    return (lay["arena_bytes"] + sum(lay["landing_region_bytes"]) + lay["staging_bytes"] + lay["ring_bytes"]
            + sum(f[1] for f in doc["checkpoint"]["files"]) + 1)


# Which field paths of each plan the blind mutations walk: all of `mixed`; what the other two hold
# that `mixed` does not (the tensor-parallel records; the refusal and what decides it).
WALKED = {
    "mixed": None,
    "tp": lambda t: t.startswith(("tensor_parallel", "layout", "parts", "runs", "tensors")),
    "tp-rows": lambda t: t.startswith("runs"),
    "refused": lambda t: t.startswith(("refusal", "budget", "peak")),
}


def corpus(built: Built) -> list[Mutation]:
    from planc.plan.admission import admit
    from planc.plan.codec import encode

    out = []
    refused = built.plans["refused"].refusal._asdict()
    for name, plan in built.plans.items():
        doc = json.loads(encode(plan))
        out += generic(name, doc, _past(doc), only=WALKED[name])

        def replay(b, plan=plan):
            r = admit(plan.with_budget(b)).refusal
            return None if r is None else r._asdict()
        out += edits(name, doc, refused, replay)
    ids = [m.id for m in out]
    assert len(ids) == len(set(ids)), "mutation ids repeat"
    return out


# --------------------------------------------------------------------------- dtype edits

def dtype_edits(name: str, doc: dict) -> Iterator[Mutation]:
    """Each kind of part (op, path, source and output dtype: the first part of each) with its dtypes
    edited, consistently wherever the plan repeats them so that only the rule of what each op can
    produce (`dtypes.op_problem`) or the checkpoint's headers can tell: the output dtype (its tensor,
    every part of that tensor and their kernels), the source dtype (the part's weight input and its
    kernel), or both, to every other dtype of the same bit width (sizes, offsets and alignment stay
    right). Each is refused, or loads bit-exact (tests/test_plan_file.py)."""
    from planc.base.dtypes import DTYPES

    f = doc["fields"]
    P, I, K = ({k: i for i, k in enumerate(f[r])} for r in ("part", "input", "kernel"))
    kernels_at = f["run"].index("kernels")
    seen = set()
    for pid, p in enumerate(doc["parts"]):
        w = p[P["inputs"]][0]
        kind = (p[P["op"]], p[P["path"]], w[I["dtype"]], p[P["out_dtype"]])
        if kind in seen:
            continue
        seen.add(kind)
        for side, now in (("out", kind[3]), ("in", kind[2]), ("both", kind[2])):
            if side == "both" and DTYPES[kind[2]].bits != DTYPES[kind[3]].bits:
                continue  # a conversion to another width: relabelling both would change its sizes
            for d in sorted(DTYPES):
                if d == now or DTYPES[d].bits != DTYPES[now].bits:
                    continue
                field = f"parts[{pid}].out_dtype" if side == "out" else f"parts[{pid}].inputs[0].dtype"
                yield Mutation(f"{name}:dtype:parts[{pid}]:{side}:{d}", name, field, "dtype",
                               _relabel(pid, side, d, P, I, K, kernels_at))


def _relabel(pid: int, side: str, d: str, P: dict, I: dict, K: dict, kernels_at: int):
    def apply(doc):
        parts = doc["parts"]
        ti = parts[pid][P["tensor_index"]]
        if side in ("out", "both"):
            doc["tensors"][ti][1] = d
            mine = {q for q, x in enumerate(parts) if x[P["tensor_index"]] == ti}
            for q in mine:
                parts[q][P["out_dtype"]] = d
        if side in ("in", "both"):
            parts[pid][P["inputs"]][0][I["dtype"]] = d
        for r in doc["runs"]:
            for k in r[kernels_at]:
                if side in ("out", "both") and k[K["part"]] in mine:
                    k[K["dst_dtype"]] = d
                if side in ("in", "both") and k[K["part"]] == pid:
                    k[K["src_dtype"]] = d
    return apply
