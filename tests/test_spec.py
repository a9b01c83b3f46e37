"""Placement specs: validation errors name the file, the field path and the YAML line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import write_spec
from planc.base.errors import SpecError
from planc.spec.model import IO, compile_match, json_schema, load_spec, validate_spec
from planc.base.units import parse_bytes

BASE = {"checkpoint": "model.safetensors", "budget": {"host": "1GiB"}, "rules": [{"match": "*"}]}


def spec_error(tmp_path: Path, text: str, name: str = "spec.yaml") -> SpecError:
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(p)
    return info.value


def test_valid_spec_defaults_and_units(tmp_path):
    p = write_spec(tmp_path, {**BASE, "budget": {"host": "1.5GB", "device": "8GiB"},
                              "io": {"slot": "64KiB", "run": 4096, "merge_gap": "1MiB"}})
    s = load_spec(p).spec
    assert s.budget.host == 1_500_000_000
    assert s.budget.device == 8 * 2**30
    assert (s.io.slot, s.io.run, s.io.merge_gap, s.io.slots, s.io.workers) == (65536, 4096, 2**20, 16, 16)
    assert s.device == "cuda:0"
    assert s.rules[0].dtype == "keep" and s.rules[0].on == "device"


def test_spec_is_frozen(tmp_path):
    s = load_spec(write_spec(tmp_path, BASE)).spec
    with pytest.raises(Exception):
        s.budget.host = 1  # type: ignore[misc]


def test_unknown_key_names_field_and_line(tmp_path):
    e = spec_error(tmp_path, "checkpoint: m.safetensors\nbudget:\n  host: 1GiB\n  hots: 2GiB\nrules:\n  - match: '*'\n")
    assert e.code == "spec-invalid"
    assert str(e).startswith(f"{tmp_path / 'spec.yaml'}:4: budget.hots: unknown key")


def test_unknown_key_inside_rule(tmp_path):
    e = spec_error(tmp_path, "checkpoint: m\nbudget: {host: 1GiB}\nrules:\n  - match: a\n  - match: b\n    typo: 1\n")
    assert "spec.yaml:6: rules[1].typo: unknown key" in e.message


def test_bad_unit_quotes_input(tmp_path):
    e = spec_error(tmp_path, "checkpoint: m\nbudget:\n  host: 3XB\nrules: [{match: '*'}]\n")
    assert "spec.yaml:3: budget.host:" in e.message
    assert "'3XB'" in e.message and "64MiB" in e.message


@pytest.mark.parametrize("value", ["-1", "'-1GiB'", "-4096"])
def test_negative_budget(tmp_path, value):
    e = spec_error(tmp_path, f"checkpoint: m\nbudget:\n  host: 1GiB\n  device: {value}\nrules: [{{match: '*'}}]\n")
    assert "spec.yaml:4: budget.device:" in e.message


def test_bad_dtype(tmp_path):
    e = spec_error(tmp_path, "checkpoint: m\nbudget: {host: 1GiB}\nrules:\n  - match: a\n  - match: '*'\n    dtype: float8\n")
    assert "spec.yaml:6: rules[1].dtype:" in e.message
    assert "float8" in e.message and "bfloat16" in e.message


@pytest.mark.parametrize("slot", [5000, 0, 2048, "6KiB"])
def test_slot_not_multiple_of_4k(tmp_path, slot):
    e = spec_error(tmp_path, f"checkpoint: m\nbudget: {{host: 1GiB}}\nio:\n  slots: 2\n  slot: {slot}\nrules: [{{match: '*'}}]\n")
    assert "spec.yaml:5: io.slot:" in e.message
    assert "4 KiB" in e.message


def test_fuse_without_order(tmp_path):
    e = spec_error(tmp_path, "checkpoint: m\nbudget: {host: 1GiB}\nrules:\n"
                             "  - match: 'l.{L}.{P}.weight'\n    fuse: {into: 'l.{L}.qkv', over: P}\n")
    assert "spec.yaml:4: rules[0]:" in e.message and "order" in e.message


@pytest.mark.parametrize("group, words", [
    ({"into": "l.{L}.x", "over": "Q", "order": ["a"]}, ["fuse.over 'Q'", "not a placeholder"]),
    ({"into": "l.{M}.x", "over": "P", "order": ["a"]}, ["fuse.into", "['M']"]),
    ({"into": "l.{L}.{P}", "over": "P", "order": ["a"]}, ["must not use the grouped placeholder {P}"]),
    ({"into": "l.{L}.x", "over": "P", "order": ["a", "a"]}, ["fuse.order lists ['a'] more than once"]),
])
def test_placeholders_mismatch(tmp_path, group, words):
    doc = {**BASE, "rules": [{"match": "l.{L}.{P}", "fuse": group}]}
    with pytest.raises(SpecError) as info:
        load_spec(write_spec(tmp_path, doc))
    for w in words:
        assert w in info.value.message
    assert "rules[0]" in info.value.message


def test_placeholder_used_twice(tmp_path):
    with pytest.raises(SpecError) as info:
        load_spec(write_spec(tmp_path, {**BASE, "rules": [{"match": "{L}.x.{L}"}]}))
    assert "['L'] more than once" in info.value.message


@pytest.mark.parametrize("rule, words", [
    ({"match": "a", "skip": True, "dtype": "float16"}, "skip rule takes no other action"),
    ({"match": "a.{L}.{P}", "fuse": {"into": "x.{L}", "over": "P", "order": ["q"]},
      "stack": {"into": "y.{L}", "over": "P"}}, "a fuse inside a stack takes no `into`"),
    ({"match": "a.{L}.{P}", "fuse": {"over": "P", "order": ["q"]},
      "stack": {"into": "y.{L}", "over": "P"}}, "must be different placeholders"),
    ({"match": "a.{L}.{E}.{P}", "fuse": {"over": "P", "order": ["q"]},
      "stack": {"into": "y.{L}.{P}", "over": "E"}}, "stack.into must not use the grouped placeholder {P}"),
    ({"match": "a.{L}.{P}", "fuse": {"over": "P", "order": ["q"]}}, "fuse needs `into`"),
    ({"match": "a.{L}", "rename": "b.{M}"}, "rename 'b.{M}' is not a name template"),
    ({"match": "a.{L}", "rename": "b.{L}", "skip": True}, "skip rule takes no other action"),
    ({"match": "a.{L}.{P}", "rename": "b.{L}", "stack": {"into": "y.{L}", "over": "P"}}, "rename is for single tensors"),
    ({"match": "a.{L}.{P}", "stack": {"into": "y.{L}", "over": "P", "dim": 1}}, "stack.dim: unknown key"),
    ({"match": "a.{L}.{P}", "fuse": {"into": "y.{L}", "over": "P", "order": ["q"], "dim": -1}}, "fuse.dim"),
    ({"match": "a.{L}.{P}", "fuse": {"into": "x.{L}", "over": "P", "order": ["q"]}, "transpose": True}, "transpose with fuse"),
    ({"match": "a", "dequantize": {}, "dtype": "float32"}, "dequantize produces bfloat16 or float16"),
])
def test_incoherent_rules(tmp_path, rule, words):
    with pytest.raises(SpecError) as info:
        load_spec(write_spec(tmp_path, {**BASE, "rules": [rule]}))
    assert words in info.value.message


def test_several_errors_reported_together(tmp_path):
    e = spec_error(tmp_path, "checkpoint: m\nbudget:\n  host: -1\nrules:\n  - match: a\n    dtype: int4\n")
    assert "spec.yaml:3: budget.host" in e.message and "spec.yaml:6: rules[0].dtype" in e.message


def test_missing_required_keys(tmp_path):
    e = spec_error(tmp_path, "checkpoint: m\nrules: [{match: '*'}]\n")
    assert "budget: required key is missing" in e.message
    e = spec_error(tmp_path, "checkpoint: m\nbudget: {host: 1GiB}\nrules: []\n")
    assert "rules" in e.message


def test_json_spec_errors_name_file_and_field(tmp_path):
    doc = {**BASE, "rules": [{"match": "*", "dtype": "half"}]}
    p = write_spec(tmp_path, doc, "spec.json")
    with pytest.raises(SpecError) as info:
        load_spec(p)
    assert info.value.message.startswith(f"{p}: rules[0].dtype:")


def test_json_spec_loads(tmp_path):
    p = write_spec(tmp_path, {**BASE, "io": {"slot": 8192}}, "spec.json")
    assert load_spec(p).spec.io.slot == 8192


def test_syntax_errors(tmp_path):
    e = spec_error(tmp_path, "checkpoint: m\nbudget: {host: 1GiB\nrules: []\n")
    assert e.code == "spec-syntax" and "spec.yaml:" in e.message
    e = spec_error(tmp_path, '{"checkpoint": "m",\n "budget": }', "spec.json")
    assert e.code == "spec-syntax" and "spec.json:2:" in e.message
    e = spec_error(tmp_path, "- a\n- b\n")
    assert e.code == "spec-not-mapping"


def test_missing_spec_file(tmp_path):
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "nope.yaml")
    assert info.value.code == "spec-missing"


def test_relative_checkpoint_resolves_against_spec_folder(tmp_path, monkeypatch):
    sub = tmp_path / "specs"
    p = write_spec(sub, {**BASE, "checkpoint": "../ckpt/model.safetensors"})
    monkeypatch.chdir(tmp_path.parent)
    loaded = load_spec(Path(tmp_path.name) / "specs" / "spec.yaml")
    assert loaded.checkpoint_path == str((tmp_path / "ckpt" / "model.safetensors").resolve())
    abs_ckpt = str(tmp_path / "elsewhere.safetensors")
    loaded = load_spec(write_spec(sub, {**BASE, "checkpoint": abs_ckpt}))
    assert loaded.checkpoint_path == abs_ckpt
    assert load_spec(p).text_sha256 == load_spec(p).text_sha256


def test_validate_spec_without_file():
    with pytest.raises(SpecError) as info:
        validate_spec({**BASE, "io": {"workers": 0}})
    assert info.value.message.startswith("<spec>: io.workers:")
    assert validate_spec(BASE).io == IO()


@pytest.mark.parametrize("text, n", [("64MiB", 64 * 2**20), ("8GiB", 8 * 2**30), ("1.5GB", 1_500_000_000),
                                     (4096, 4096), ("4096", 4096), ("2k", 2048), (" 3 MB ", 3_000_000)])
def test_parse_bytes(text, n):
    assert parse_bytes(text) == n


@pytest.mark.parametrize("text", [True, -1, "1.5B", "abc", "1 XiB", None, 1.5])
def test_parse_bytes_refuses(text):
    with pytest.raises(ValueError):
        parse_bytes(text)


@pytest.mark.parametrize("value, shown", [("2024-01-01", "date 2024-01-01"), ("[1, ~, true]", "list [1, null, true]"),
                                          ("{a: 1}", 'dict {"a": 1}'), ("[64MiB]", 'list ["64MiB"]'),
                                          ("!!binary aGVsbG8=", "binary data of 5 bytes")])
def test_a_byte_size_of_another_yaml_type_is_shown_as_written(tmp_path, value, shown):
    """YAML reads `2024-01-01` as a date: the message says what it was read as, not a Python repr."""
    p = tmp_path / "s.yaml"
    p.write_text(f"checkpoint: x.safetensors\nbudget: {{host: {value}}}\nrules:\n  - match: \"*\"\n")
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert "budget.host" in str(e.value) and shown in str(e.value)
    assert not any(w in str(e.value) for w in ("datetime", "None", "True", "b'"))


@pytest.mark.parametrize("glob, name, groups", [
    ("model.layers.{L}.mlp.{P}.weight", "model.layers.3.mlp.up.weight", {"L": "3", "P": "up"}),
    ("model.layers.{L}.mlp.{P}.weight", "model.layers.3.x.mlp.up.weight", None),
    ("model.*.weight", "model.a.b.weight", {}),
    ("a?c", "abc", {}),
    ("[ab]x", "cx", None),
    ("*", "anything.at.all", {}),
])
def test_compile_match(glob, name, groups):
    m = compile_match(glob).match(name)
    assert (m.groupdict() if m else None) == groups


def test_json_schema_forbids_extra_keys():
    s = json_schema()
    assert s["additionalProperties"] is False
    assert {"checkpoint", "budget", "rules"} <= set(s["required"])
    assert json.dumps(s)


def test_unknown_source_dtype(tmp_path):
    e = spec_error(tmp_path, "checkpoint: m\nbudget: {host: 1GiB}\nrules:\n  - match: '*'\n    source_dtype: [F8_E4M3, FP8]\n")
    assert "spec.yaml:5: rules[0].source_dtype: unknown safetensors dtypes ['FP8']" in e.message


@pytest.mark.parametrize("rule, field", [
    ({"match": "w", "dequantize": {"scale": "{weight}_scale"}}, "rules[0].dequantize.scale"),
    ({"match": "a.{P}", "fuse": {"into": "x.{0}", "over": "P", "order": ["q"]}}, "rules[0]"),
])
def test_bad_name_templates(tmp_path, rule, field):
    with pytest.raises(SpecError) as info:
        load_spec(write_spec(tmp_path, {**BASE, "rules": [rule]}))
    assert f"{field}:" in info.value.message and "name template" in info.value.message


@pytest.mark.parametrize("line, words", [
    ("tensor_parallel: {size: 2.0}", "tensor_parallel.size: Input should be a valid integer"),
    ("io: {workers: '4'}", "io.workers: Input should be a valid integer"),
    ("rules: [{match: 'model.{L'}]", "a brace must be part of a placeholder"),
    ("rules: [{match: 'model.{1x}.weight'}]", "a brace must be part of a placeholder"),
    ("rules: [{match: 'a}'}]", "a brace must be part of a placeholder"),
    ("rules: [{match: '[abc'}]", "no ] closes"),
    ("rules: [{match: 'a[b]c[d'}]", "no ] closes"),
    ("rules: [{match: 'x[]'}]", "no ] closes"),
    ("rules: [{match: '[!]'}]", "no ] closes"),
    ("rules: [{match: 'a[{L}]b'}]", "no ] closes"),
    ("rules: [{match: '*', Split: replicate}]", "rules[0].Split: unknown key"),
    ("io: {Split: 1}", "io.Split: unknown key"),
    ("rules: [{match: 'lm_head.weight', rename: ''}, {match: '*'}]", "rename must name a tensor"),
    ("rules: [{match: '*', split: {dim: -1}}]", "rules[0].split.dim: Input should be greater than or equal to 0"),
    ("rules: [{match: '*', split: replicat}]", "rules[0].split: must be replicate or {dim: D}"),
])
def test_typos_that_would_be_taken_literally_or_read_loosely_are_refused(tmp_path, line, words):
    key = line.split(":", 1)[0]
    base = {"checkpoint": "checkpoint: m.safetensors", "budget": "budget: {host: 1MiB}",
            "rules": "rules: [{match: '*'}]"}
    base[key] = line
    e = spec_error(tmp_path, "\n".join(base.values()) + "\n")  # the line replaces its key's, or is added
    assert words in e.message, e.message
    assert "literal[" not in e.message  # one form of split reported, untagged
    assert ".Split" not in e.message or ".Split: unknown key" in words  # (a user's own key may be Split)


def test_placeholders_and_character_sets_still_match():
    from planc.spec.model import Rule

    r = Rule(match="model.layers.[0-9].{P}.weight")
    assert r.pattern().match("model.layers.3.q.weight").group("P") == "q"
    for glob, name in (("[!a]*", "b.weight"), ("[]]*", "]x"), ("*.{P}.weight", "a.q.weight"), ("[!]]x", "ax")):
        assert Rule(match=glob).pattern().match(name), glob
