"""What compile and the plan reader hold each other to, and the inputs that used to slip past them.

1. One rule of what each op can produce (`dtypes.op_problem`): a device transpose relabelled
   BF16 -> F16, conversions of integers, dequantizations of non-FP8 weights and host conversions of
   integers are plan errors (exit 2, one line) before anything is allocated; the compiler refuses
   the same in a spec, naming the rule and the tensor. Every field path of the plans' dtypes is
   edited in tests/test_plan_file.py (`dtype_edits`).
2. One set of limits (`planc.base.limits`): what a spec may ask (`dequantize.block`, `io.slot`) and what
   a checkpoint may hold (dims, their count) compiles to plans the reader accepts, and what is past
   them is refused at compile; a zero-size tensor with a dim past 2**62 is refused when its header
   is read.
3. A plan field nested hundreds or thousands deep is one plan-error line, at every depth.
4. Plans and specs are told apart by content, whatever the file's name.
5. The fast plan parser's count of keys is not fooled by white space before a colon.
6. `--report ""` and `probe --size` below its minimum are usage errors.
7. Settings of every type: every setting name given values of every kind is a typed `SettingError`
   or a value of the setting's own type.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings as hsettings, strategies as st  # noqa: E402

from execute_support import cli_run, handmade, one_line, spec_file  # noqa: E402
from planc.base import limits, settings  # noqa: E402
from planc.compiler.compile import compile_spec  # noqa: E402
from planc.base.dtypes import DTYPES, op_problem  # noqa: E402
from planc.base.errors import BindError, ManifestError, PlanFormatError, SpecError  # noqa: E402
from planc.manifest import read_manifest  # noqa: E402
from planc.plan.codec import decode, encode, load_plan, save_plan  # noqa: E402
from planc.spec.model import load_spec  # noqa: E402


def _plan_error(fn) -> PlanFormatError:
    with pytest.raises(PlanFormatError) as e:
        fn()
    assert e.value.exit_code == 2 and "\n" not in e.value.message and "Traceback" not in e.value.message
    return e.value


def _edit(plan, fn) -> bytes:
    doc = json.loads(encode(plan))
    fn(doc)
    return json.dumps(doc).encode()


# ------------------------------------------------------------------------------------------
# 1. what each op can produce


def _fields(doc, record):
    return {k: i for i, k in enumerate(doc["fields"][record])}


def test_a_device_transpose_relabelled_bf16_to_f16_is_refused(tmp_path, capsys):
    """The defect found: a device transpose of BF16 with its tensor, part and kernel edited to F16
    (the same bit width: sizes and offsets agree) moved BF16 bits under an F16 label, exit 0."""
    w = (np.arange(12 * 20, dtype=np.float32) / 7).astype(ml_dtypes.bfloat16).reshape(12, 20)
    ck, _ = handmade(tmp_path, {"t.w": w})
    plan = compile_spec(spec_file(tmp_path, ck, [{"match": "*", "transpose": True}]))
    assert [(p.op, p.path, p.out_dtype) for p in plan.parts] == [("transpose", "direct", "BF16")]

    def relabel(doc):
        doc["tensors"][0][1] = "F16"
        doc["parts"][0][_fields(doc, "part")["out_dtype"]] = "F16"
        k = doc["runs"][0][doc["fields"]["run"].index("kernels")][0]
        k[_fields(doc, "kernel")["dst_dtype"]] = "F16"

    text = _edit(plan, relabel)
    e = _plan_error(lambda: decode(text, "edited"))
    assert e.code == "plan-invalid" and "parts[0].out_dtype" in e.message and "keeps its dtype" in e.message
    path = tmp_path / "edited.json"
    path.write_bytes(text)
    rc, out, err = cli_run(capsys, "run", path)
    assert rc == 2 and out == "" and "parts[0].out_dtype" in one_line(err)


@pytest.mark.parametrize("src,rule,field,words", [
    ("I32", {"dtype": "float16"}, "out_dtype", "converts F32, F16 or BF16 only, not I32"),  # conversion of an integer
    ("I16", {"dtype": "float32", "on": "host"}, "out_dtype", "not I16"),  # host conversion of an integer
    ("U8", {"dtype": "float16"}, "out_dtype", "not U8"),
])
def test_conversions_of_integers_are_refused_by_compile_and_by_the_reader(tmp_path, src, rule, field, words):
    """Compile refuses a conversion of a non-float tensor (a spec error naming the rule and the
    tensor); a plan edited into one (a float conversion relabelled: the weight input says `src`) is
    a plan error: both before anything is allocated."""
    n = 64
    a = np.arange(n, dtype=DTYPES[src].numpy)
    ck, _ = handmade(tmp_path, {"x.w": a})
    with pytest.raises(BindError) as e:
        compile_spec(spec_file(tmp_path, ck, [{"match": "*", **rule}], name="int.yaml"))
    assert e.value.exit_code == 2 and "rules[0]" in e.value.message and "x.w" in e.value.message
    # the same plan from a float of the same width, its source relabelled as the integer
    float_of = {8: "float8_e4m3fn", 16: "float16", 32: "float32"}[DTYPES[src].bits]
    ck2, _ = handmade(tmp_path, {"x.w": np.ones(n, getattr(ml_dtypes, float_of, None) or np.dtype(float_of))},
                      name="f.safetensors")
    if DTYPES[src].bits == 8:  # no F8 conversion: refused by compile already, as the table says
        return
    plan = compile_spec(spec_file(tmp_path, ck2, [{"match": "*", **rule}], name="float.yaml"))

    def relabel(doc):
        i = doc["parts"][0][_fields(doc, "part")["inputs"]][0]
        i[_fields(doc, "input")["dtype"]] = src
        for r in doc["runs"]:
            for k in r[doc["fields"]["run"].index("kernels")]:
                k[_fields(doc, "kernel")["src_dtype"]] = src

    e = _plan_error(lambda: decode(_edit(plan, relabel), "edited"))
    assert f"parts[0].{field}" in e.message and words in e.message


def test_a_dequantization_of_a_non_fp8_weight_is_refused(tmp_path):
    w = (np.random.default_rng(1).standard_normal((130, 70)) * 0.5).astype(np.float32)
    s = np.ones((2, 1), np.float32)
    ck, _ = handmade(tmp_path, {"w": w, "w_scale_inv": s})
    with pytest.raises(BindError, match=r"rules\[0\] dequantizes w, but it is stored as F32"):
        compile_spec(spec_file(tmp_path, ck, [{"match": "w", "dequantize": {}}]))
    ck, _ = handmade(tmp_path, {"w": w.astype(ml_dtypes.float8_e4m3fn), "w_scale_inv": s}, name="fp8.safetensors")
    plan = compile_spec(spec_file(tmp_path, ck, [{"match": "w", "dequantize": {}}], name="fp8.yaml"))
    for dt in ("I8", "U8", "BOOL"):  # same width as F8_E4M3: only the rule tells
        def relabel(doc, dt=dt):
            doc["parts"][0][_fields(doc, "part")["inputs"]][0][_fields(doc, "input")["dtype"]] = dt
            for k in doc["runs"][0][doc["fields"]["run"].index("kernels")]:
                k[_fields(doc, "kernel")["src_dtype"]] = dt
        e = _plan_error(lambda: decode(_edit(plan, relabel), "edited"))
        assert "parts[0].out_dtype" in e.message and f"not {dt} with F32 scales" in e.message


def test_the_table_allows_what_the_executor_runs_and_nothing_else():
    """The rule, over every op, path and pair of dtypes: what it accepts is what the kernels and the
    host routines do (copies of anything; F32/F16/BF16 among themselves; FP8 and FP4 to a float)."""
    floats = {"F32", "F16", "BF16"}
    for op in ("copy", "convert", "transpose", "dequantize", "dequantize_t", "gguf"):
        for path in ("direct", "host"):
            for s in DTYPES:
                for d in DTYPES:
                    scale = "F32" if op.startswith("dequantize") else None
                    ok = op_problem(op, path, s, d, scale) is None
                    want = {"copy": s == d,
                            "convert": s in floats and d in floats and s != d,
                            "transpose": DTYPES[s].bits % 8 == 0 and (s == d or (path == "host" and s in floats
                                                                                 and d in floats)),
                            "dequantize": s in ("F8_E4M3", "F8_E5M2") and d in floats,
                            "dequantize_t": False,
                            "gguf": s == "U8" and d in floats}[op]  # GGUF blocks read as U8
                    assert ok == want, (op, path, s, d)
    assert op_problem("dequantize", "host", "U8", "BF16", "U8") is None  # mxfp4
    assert op_problem("dequantize_t", "host", "U8", "F32", "F8_E4M3") is None  # nvfp4
    assert op_problem("dequantize", "host", "U8", "I8", "U8") is not None


# ------------------------------------------------------------------------------------------
# 2. one set of limits


def _st_header(entries: dict) -> bytes:
    """A safetensors file of the given header entries (all zero-size), written byte by byte."""
    head = json.dumps(entries).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head


@pytest.mark.parametrize("shape", [[0, 2**64], [0, 2**63], [2**62 + 1, 0], [0, 2**100]])
def test_a_zero_size_tensor_with_a_dim_past_the_limit_is_refused_when_read(tmp_path, capsys, shape):
    p = tmp_path / "z.safetensors"
    p.write_bytes(_st_header({"z": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}}))
    with pytest.raises(ManifestError) as e:
        read_manifest(p)
    assert e.value.code == "bad-shape" and "2**62" in e.value.message
    rc, out, err = cli_run(capsys, "inspect", p)
    assert rc == 2 and out == "" and "[bad-shape]" in one_line(err)
    s = spec_file(tmp_path, p, [{"match": "*"}])
    rc, out, err = cli_run(capsys, "compile", s, "-o", tmp_path / "plan.json")
    assert rc == 2 and out == "" and "[bad-shape]" in one_line(err) and not (tmp_path / "plan.json").exists()


def test_a_dim_at_the_limit_compiles_to_a_plan_the_reader_takes(tmp_path):
    p = tmp_path / "z.safetensors"
    p.write_bytes(_st_header({"z": {"dtype": "F32", "shape": [0, limits.MAX_DIM], "data_offsets": [0, 0]}}))
    plan = compile_spec(spec_file(tmp_path, p, [{"match": "*"}]))
    save_plan(plan, tmp_path / "plan.json")
    assert load_plan(tmp_path / "plan.json").tensors[0].shape == (0, limits.MAX_DIM)


@pytest.mark.parametrize("ndim", [limits.MAX_DIMS, limits.MAX_DIMS + 1])
def test_more_dims_than_a_plan_holds_are_refused_at_compile(tmp_path, capsys, ndim):
    ck, _ = handmade(tmp_path, {"many": np.ones((1,) * ndim, np.float32)})
    s = spec_file(tmp_path, ck, [{"match": "*"}])
    rc, out, err = cli_run(capsys, "compile", s, "-o", tmp_path / "plan.json")
    if ndim <= limits.MAX_DIMS:
        assert rc == 0 and len(load_plan(tmp_path / "plan.json").tensors[0].shape) == ndim
    else:
        line = one_line(err)
        assert rc == 2 and "[shape-limit]" in line and "rules[0]" in line and "many" in line
        assert not (tmp_path / "plan.json").exists()


def test_a_stack_that_would_pass_the_dim_limit_is_refused(tmp_path):
    ck, _ = handmade(tmp_path, {f"e.{k}": np.ones((1,) * limits.MAX_DIMS, np.float32) for k in range(2)})
    s = spec_file(tmp_path, ck, [{"match": "e.{E}", "stack": {"into": "e", "over": "E"}}])
    with pytest.raises(BindError, match=r"rules\[0\] loads e of shape .* has 17 dims") as e:
        compile_spec(s)
    assert e.value.code == "shape-limit"


def _fp8(tmp_path):
    w = (np.random.default_rng(2).standard_normal((130, 70)) * 0.5).astype(ml_dtypes.float8_e4m3fn)
    return handmade(tmp_path, {"w": w, "w_scale_inv": np.ones((1, 1), np.float32)})[0]


@pytest.mark.parametrize("field,value,ok", [
    ("block", limits.MAX_BLOCK, True), ("block", limits.MAX_BLOCK + 1, False),
    ("slot", limits.MAX_SLOT, True), ("slot", limits.MAX_SLOT + 4096, False),
    ("map_window", limits.MIN_MAP_WINDOW, True), ("map_window", limits.MIN_MAP_WINDOW - 1, False),
    ("map_window", limits.MAX_MAP_WINDOW, True), ("map_window", limits.MAX_MAP_WINDOW + 1, False),
    ("workers", limits.MAX_WORKERS, True), ("workers", limits.MAX_WORKERS + 1, False),
    ("slots", limits.MAX_SLOTS, True), ("slots", limits.MAX_SLOTS + 1, False),
    ("map_lanes", limits.MAX_MAP_LANES, True), ("map_lanes", limits.MAX_MAP_LANES + 1, False),
])
def test_spec_limits_are_the_plan_readers(tmp_path, field, value, ok):
    """At each limit the spec compiles to a plan the reader takes back (refused by its budget or
    not); one past it is a spec error: compile never writes what the reader refuses."""
    ck = _fp8(tmp_path)
    rules = [{"match": "w", "dequantize": {"block": value}}] if field == "block" else [{"match": "*"}]
    io = {} if field == "block" else {field: value}
    s = spec_file(tmp_path, ck, rules, io=io)
    if not ok:
        with pytest.raises(SpecError) as e:
            load_spec(s)
        assert e.value.exit_code == 2
        return
    plan = compile_spec(s)
    save_plan(plan, tmp_path / "plan.json")
    back = load_plan(tmp_path / "plan.json")
    assert encode(back) == encode(plan)


# ------------------------------------------------------------------------------------------
# 3. nesting


@pytest.fixture(scope="module")
def small_plan(tmp_path_factory):
    d = tmp_path_factory.mktemp("small")
    ck, _ = handmade(d, {"a": np.ones(64, np.float32), "b": np.ones((4, 8), np.float16)})
    plan = compile_spec(spec_file(d, ck, [{"match": "*"}]))
    return d, encode(plan)


@pytest.mark.parametrize("depth", [10, 100, 500, 900, 990, 1000, 1025, 1100, 5000, 100_000])
@pytest.mark.parametrize("field", ['"device":', '"format":', '"host_bytes":', '"parts":', '"costs":'])
def test_a_field_nested_deep_is_one_plan_error(small_plan, capsys, depth, field):
    folder, text = small_plan
    at = text.index(field) + len(field)
    end = at + 1
    while text[end] not in ",}":  # the value: a scalar, or the first element of an array/object
        end += 1
    opener = "[" if depth % 2 else '{"k":'
    closer = "]" if depth % 2 else "}"
    nested = text[:at] + opener * depth + "1" + closer * depth + text[end:] if field not in ('"parts":', '"costs":') \
        else text[:at] + opener * depth + "1" + closer * depth + "," + text[at:].split(",", 1)[1]
    e = _plan_error(lambda: decode(nested, "deep"))
    assert len(e.message) < 400 and e.code in ("plan-syntax", "plan-invalid", "plan-version", "plan-too-large"), e.message
    p = folder / f"deep-{depth}.json"
    p.write_text(nested)
    rc, out, err = cli_run(capsys, "explain", p)
    assert rc == 2 and out == "" and one_line(err)


# ------------------------------------------------------------------------------------------
# 4. plan or spec, by content


@pytest.mark.parametrize("name", ["plan.txt", "plan.yaml", "plan", "PLAN.JSON", "plan.json.bak"])
def test_a_plan_under_any_name_is_read_as_a_plan(small_plan, capsys, name):
    folder, text = small_plan
    p = folder / name
    p.write_text(text)
    rc, out, err = cli_run(capsys, "explain", p, "--json")
    assert rc == 0 and err == "" and json.loads(out)["fits"] is True
    p.write_text(text[:len(text) // 2])  # truncated: still a plan, one line
    rc, out, err = cli_run(capsys, "explain", p)
    assert rc == 2 and "[plan-syntax]" in one_line(err)


@pytest.mark.parametrize("content", [b"", b"\x00\x01\xff\xfe" * 64, b"\n\n", b"\xff" * 9, b"{}\x00"])
def test_an_empty_or_binary_json_is_one_plan_error(tmp_path, capsys, content):
    p = tmp_path / "x.json"
    p.write_bytes(content)
    rc, out, err = cli_run(capsys, "explain", p)
    line = one_line(err)
    assert rc == 2 and out == "" and "[plan-syntax]" in line, line


@pytest.mark.parametrize("content", [b"[]", b"null", b'{"a": 1}', b'{"checkpoint": ', b"[" * 5000])
def test_a_foreign_json_is_one_error_line(tmp_path, capsys, content):
    p = tmp_path / "x.json"
    p.write_bytes(content)
    for cmd in ("explain", "run"):
        rc, out, err = cli_run(capsys, cmd, p)
        assert rc == 2 and out == "" and one_line(err)


@pytest.mark.parametrize("name", ["spec.json", "spec.yaml", "spec.yml", "spec"])
def test_a_spec_with_keys_a_plan_also_has_is_still_a_spec(tmp_path, capsys, name):
    """A spec whose quoted keys are also a plan's (`"format"` of a dequantize, `"device"`, `"budget"`)."""
    w = (np.random.default_rng(3).standard_normal((130, 70)) * 0.5).astype(ml_dtypes.float8_e4m3fn)
    ck, _ = handmade(tmp_path, {"w": w, "w_scale_inv": np.ones((2, 1), np.float32)})
    p = tmp_path / name
    p.write_text(json.dumps({"checkpoint": str(ck), "device": "cuda:0", "budget": {"host": "64MiB"},
                             "rules": [{"match": "w", "dequantize": {"format": "fp8", "block": 128}}]}))
    rc, out, err = cli_run(capsys, "explain", p, "--json")
    assert rc == 0 and json.loads(out)["fits"] is True, err


def test_a_json_spec_is_still_a_spec(tmp_path, capsys):
    ck, _ = handmade(tmp_path, {"a": np.ones(64, np.float32)})
    p = tmp_path / "spec.json"
    p.write_text(json.dumps({"checkpoint": str(ck), "budget": {"host": "64MiB"}, "rules": [{"match": "*"}]}))
    rc, out, err = cli_run(capsys, "explain", p, "--json")
    assert rc == 0 and json.loads(out)["fits"] is True
    p.write_text(json.dumps({"checkpoint": str(ck), "budget": {"hots": "64MiB"}, "rules": [{"match": "*"}]}))
    rc, out, err = cli_run(capsys, "explain", p)
    assert rc == 2 and "spec" in one_line(err)


# ------------------------------------------------------------------------------------------
# 5. repeated keys, white space before the colon


@pytest.mark.parametrize("ws", [" ", "\t", "\n", "\r\n", "  \n\t "])
@pytest.mark.parametrize("where", ["top", "nested"])
def test_a_repeated_key_is_seen_whatever_the_white_space(small_plan, ws, where):
    _, text = small_plan
    doc = json.loads(text)
    if where == "top":  # `budget` twice, the second (the one a last-wins parser keeps) allowing 1 byte
        dup = text[:-2] + f',"budget"{ws}:{{"host_bytes":1,"device_bytes":null}}' + "}\n"
    else:
        dup = text.replace('"io":{', f'"io":{{"workers"{ws}:{doc["io"]["workers"] + 1},', 1)
    e = _plan_error(lambda: decode(dup, "dup"))
    assert "appears twice" in e.message
    # the same white space without a repeat reads as the plan it is
    spaced = text.replace('"budget":', f'"budget"{ws}:', 1)
    assert encode(decode(spaced, "spaced")) == text


# ------------------------------------------------------------------------------------------
# 6. flags that were ignored


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_report_path_is_a_usage_error(small_plan, capsys, value):
    folder, text = small_plan
    p = folder / "plan.json"
    p.write_text(text)
    rc, out, err = cli_run(capsys, "run", p, "--report", value)
    assert rc == 2 and out == "" and "--report" in one_line(err) and "[usage]" in err


@pytest.mark.parametrize("size", ["1KiB", "0", "64MiB-1"])
def test_a_probe_size_below_the_minimum_is_a_usage_error(tmp_path, capsys, size):
    if size == "64MiB-1":
        size = str(64 * 2**20 - 1)
    out_file = tmp_path / "probe.json"
    rc, out, err = cli_run(capsys, "probe", tmp_path, "--size", size, "-o", out_file)
    line = one_line(err)
    assert rc == 2 and "64MiB" in line and "[usage]" in line and not out_file.exists()


# ------------------------------------------------------------------------------------------
# 7. settings of every type

_TYPED = {"raw_launch": bool, "kernel_cache": bool, "debug": bool, "host_reserve": int, "kernel_dir": Path,
          "probe": (Path, type(None)), "plan_cache": (Path, type(None)), "pin": str, "digest_hash": str,
          "issue_gil": str, "ring": str}
_VALUES = [None, True, False, 0, 1, -1, 2**70, 1.5, float("nan"), "", "0", "1", "yes", "off", "1GiB", "register",
           b"1", [], ["pin"], {}, {"a": 1}, object(), Path("/tmp/x"), ("1",)]


def test_every_setting_is_listed():
    assert set(_TYPED) == set(settings.NAMES)


@pytest.mark.parametrize("name", sorted(settings.NAMES))
@pytest.mark.parametrize("value", _VALUES, ids=[repr(v)[:20] for v in _VALUES])
def test_a_setting_of_any_type_is_typed_or_refused(name, value):
    _check_setting(name, value)


def _check_setting(name, value):
    try:
        s = settings.Settings.resolve({name: value}, environ={})
    except settings.SettingError as e:
        assert "\n" not in str(e) and name in str(e)
        return
    got = getattr(s, name)
    assert isinstance(got, _TYPED[name]), (name, value, got)
    if _TYPED[name] is bool:  # only a bool, or the variable's own "0"/"1", sets a flag
        assert value in (True, False, "0", "1") and got == (value in (True, "1"))
    if name == "host_reserve":
        assert type(value) in (int, str) and 0 <= got <= limits.MAX_BYTES
    if name == "pin":
        assert got in settings.PIN_METHODS
    if name in settings.NAMED:
        assert got in settings.NAMED[name]


@hsettings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(settings.NAMES)),
       value=st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
                       st.binary(max_size=8), st.lists(st.integers(), max_size=3),
                       st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)))
def test_settings_of_random_values_are_typed_or_refused(name, value):
    _check_setting(name, value)


@hsettings(max_examples=200, deadline=None)
@given(name=st.sampled_from(sorted(settings.NAMES)), value=st.text(max_size=30))
def test_settings_from_the_environment_are_typed_or_refused(name, value):
    """PLANC_* variables of any text: typed, or a SettingError that says it came from the environment."""
    if "\x00" in value:
        return  # no environment holds a NUL
    try:
        s = settings.Settings.from_env({settings.NAMES[name]: value})
    except settings.SettingError as e:
        assert e.from_env and settings.NAMES[name] in str(e) and "\n" not in str(e)
        return
    assert isinstance(getattr(s, name), _TYPED[name])


def test_the_spec_schema_states_the_plan_readers_limits():
    """The limits the spec's JSON schema states are the plan reader's (one table)."""
    from planc.spec.model import json_schema

    io = json_schema()["$defs"]["IO"]["properties"]
    assert io["workers"]["maximum"] == limits.MAX_WORKERS and io["slots"]["maximum"] == limits.MAX_SLOTS
    assert io["map_lanes"]["maximum"] == limits.MAX_MAP_LANES
