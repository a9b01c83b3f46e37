"""The docs cannot rot: every YAML and JSON example in README.md and docs/*.md is run, every
```console block tagged `checked` is run and its output compared, and every flag of every command
is in docs/cli.md.

Convention for fenced examples: the info string after the language holds words that say how the
block is checked, and a ```yaml or ```json block without one fails this test.

- `synth=FAMILY` (`dense`, `moe`, `fp8`): a whole spec. Its `checkpoint` is written where it
  points (relative to the spec) by `planc synth --family FAMILY`: a `*.safetensors.index.json` is
  written with 2 shards, a `*.safetensors` file as that file, anything else as a folder. The spec
  is read with planc's own loader (YAML or JSON, as the block's language says) and compiled for
  every rank of its `tensor_parallel.size`; each plan must be admitted.
- `fragment synth=FAMILY`: some top-level keys of a spec (usually `rules:`); they replace those
  of `{checkpoint: ckpt, budget: {host: 1GiB}, rules: [{match: "*"}]}`, and the result is checked
  as above.
- `experts=N`: with `synth=moe`, N experts per layer.
- `error=CODE`: the example shows a refused spec: reading or compiling it raises that code.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest
import yaml

from planc.compiler.compile import compile_spec
from planc.base.errors import PlancError
from planc.spec.model import load_spec
from planc.spec.parse import parse_yaml
from planc.tools.synth import write_checkpoint

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(yaml|yml|json)([^\n]*)\n(.*?)^```", re.M | re.S)
BASE = {"checkpoint": "ckpt", "budget": {"host": "1GiB"}, "rules": [{"match": "*"}]}


def _examples():
    for doc in DOCS:
        text = doc.read_text()
        for m in _FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            tags = dict(w.split("=", 1) if "=" in w else (w, "") for w in m.group(2).split())
            yield pytest.param(m.group(1), tags, m.group(3), id=f"{doc.name}:{line}")


EXAMPLES = list(_examples())


def test_there_are_examples():
    assert len(EXAMPLES) >= 8


def _write_checkpoint(spec_path: Path, checkpoint: str, tags: dict) -> None:
    target = (spec_path.parent / checkpoint).resolve()
    family = tags["synth"]
    if family == "gguf":  # a `.gguf` file: the gguf package's writer, through planc synth
        from planc.tools.synth_gguf import write_gguf

        res = write_gguf(target.parent, quant=tags.get("quant", "Q8_0"), layers=1)
        assert Path(res.path).name == target.name, f"synth writes {res.path}, the example reads {target}"
        return
    experts = int(tags["experts"]) if "experts" in tags else None
    if target.name.endswith(".safetensors.index.json"):
        write_checkpoint(target.parent, family, shards=2, experts=experts)
    elif target.suffix == ".safetensors":
        res = write_checkpoint(target.parent, family, experts=experts)
        assert Path(res.path).name == target.name, f"synth writes {res.path}, the example reads {target}"
    else:
        write_checkpoint(target, family, experts=experts)


@pytest.mark.parametrize("lang,tags,body", EXAMPLES)
def test_doc_example(tmp_path, lang, tags, body):
    assert "synth" in tags or "error" in tags, (
        "tag this example (see tests/test_docs.py): ```yaml synth=dense, ```yaml fragment synth=moe, ...")
    ext = ".json" if lang == "json" else ".yaml"
    spec = tmp_path / "specs" / f"example{ext}"  # one level down, so that `../ckpt` stays in tmp_path
    spec.parent.mkdir()
    if "fragment" in tags:
        part = parse_yaml(body, "fragment")[0]  # planc's reading: YAML 1.2 booleans
        assert isinstance(part, dict), "a fragment is a mapping of top-level spec keys"
        text = yaml.safe_dump({**BASE, **part}, sort_keys=False)
        ext = ".yaml"
        spec = spec.with_suffix(ext)
    else:
        text = body
    spec.write_text(text)
    if "error" in tags:
        with pytest.raises(PlancError) as e:
            compile_spec(spec, 0)
        assert e.value.code == tags["error"], e.value
        return
    loaded = load_spec(spec)
    _write_checkpoint(spec, loaded.spec.checkpoint, tags)
    size = loaded.spec.tensor_parallel.size
    for rank in range(size):
        plan = compile_spec(spec, rank)
        assert plan.fits, plan.refusal


def _sections() -> dict[str, str]:
    text = (ROOT / "docs" / "cli.md").read_text()
    parts = re.split(r"^## planc (\w+)\n", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def test_every_flag_of_every_command_is_documented():
    import typer.main

    from planc.face.cli import app

    group = typer.main.get_command(app)
    sections = _sections()
    missing = []
    for name, cmd in sorted(group.commands.items()):
        if name not in sections:
            missing.append(f"section ## planc {name}")
            continue
        for p in cmd.params:
            for opt in [*p.opts, *getattr(p, "secondary_opts", [])]:
                if opt.startswith("-") and opt != "--help" and f"`{opt}" not in sections[name] \
                        and f"/ {opt}`" not in sections[name]:
                    missing.append(f"planc {name} {opt}")
            if p.param_type_name == "argument" and f"`{p.name.upper()}`" not in sections[name]:
                missing.append(f"planc {name} argument {p.name.upper()}")
    assert not missing, f"not in docs/cli.md: {missing}"


def test_error_codes_in_the_exit_table_exist():
    """Every `[code]` the exit-code table of docs/cli.md names is one planc raises."""
    text = (ROOT / "docs" / "cli.md").read_text()
    table = text[text.index("## Exit codes and errors"):text.index("## planc inspect")]
    codes = set(re.findall(r"`\[([a-z0-9-]+)\]`", table))
    source = "\n".join(p.read_text() for p in (ROOT / "planc").rglob("*.py"))
    unknown = sorted(c for c in codes if f'"{c}"' not in source)
    assert not unknown, unknown


def test_packaged_specs_are_the_checkout_specs():
    """planc/specs/ (what the wheel ships) holds the same files as specs/ (what the docs name)."""
    top = {p.name: p.read_bytes() for p in (ROOT / "specs").glob("*.yaml")}
    packaged = {p.name: p.read_bytes() for p in (ROOT / "planc" / "specs").glob("*.yaml")}
    assert top == packaged


def test_every_spec_key_is_documented():
    """Every field of the spec models has a row in docs/spec.md (`budget.host`, `io.run`, rule keys...)."""
    from planc.spec.model import IO, Budget, Rule, Spec, TensorParallel

    text = (ROOT / "docs" / "spec.md").read_text()
    keys = [k for k in Spec.model_fields if k not in ("budget", "io", "tensor_parallel")]
    keys += [f"{p}.{k}" for p, m in (("budget", Budget), ("io", IO), ("tensor_parallel", TensorParallel))
             for k in m.model_fields]
    keys += list(Rule.model_fields)
    missing = [k for k in keys if f"| `{k}` |" not in text]
    assert not missing, f"not in docs/spec.md's tables: {missing}"


# -- console examples ---------------------------------------------------------------------------
# A ```console block tagged `checked` is run: each `$ ` line in bash, from a folder set up as the
# docs describe it (`planc demo --no-run` beside a copy of specs/, then demo/tight.yaml and
# demo/tp.yaml as cli.md words them), 110 columns wide, under the CUDA simulator; what it prints
# (stdout and stderr together, trailing spaces dropped, the folder shown as /work/main) must be the
# lines under it. Blocks with timings or machine figures are left untagged.
_CONSOLE = re.compile(r"^```console checked\n(.*?)^```", re.M | re.S)


def _console_blocks():
    for doc in DOCS:
        text = doc.read_text()
        for m in _CONSOLE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            yield pytest.param(m.group(1), id=f"{doc.name}:{line}")


CONSOLE = list(_console_blocks())


def test_there_are_checked_console_examples():
    assert len(CONSOLE) >= 5


@contextlib.contextmanager
def _console_folder():
    """(folder, env) set up as the docs describe it; removed afterwards."""
    import os
    import shutil
    import subprocess
    import sys

    # A folder whose path is as long as /work/main's, so that lines wrap where the docs show them.
    home = None
    for i in range(1000):
        cand = Path(f"/tmp/pc{i:03d}")
        try:
            cand.mkdir()
        except FileExistsError:
            continue
        home = cand
        break
    if home is None or os.path.realpath(home) != str(home):
        pytest.skip("no folder with a path as long as /work/main's")
    try:
        (home / "specs").mkdir()
        (home / "specs" / "demo.yaml").write_text((ROOT / "specs" / "demo.yaml").read_text())
        (home / "bin").mkdir()
        shim = home / "bin" / "planc"
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m planc "$@"\n')
        shim.chmod(0o755)
        env = dict(os.environ, PATH=f"{home / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", COLUMNS="110",
                   NUMBA_ENABLE_CUDASIM="1", PLANC_PROBE="off", PLANC_PLAN_CACHE="off", PYTHONPATH=str(ROOT))
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            env.pop(k, None)
        subprocess.run(["planc", "demo", "--no-run"], cwd=home, env=env, check=True, capture_output=True)
        demo = yaml.safe_load((ROOT / "specs" / "demo.yaml").read_text())
        tight = dict(demo, checkpoint="dense/model.safetensors", budget={"host": "192KiB", "device": "1GiB"})
        (home / "demo" / "tight.yaml").write_text(yaml.safe_dump(tight, sort_keys=False))
        tp = dict(demo, checkpoint="dense/model.safetensors", tensor_parallel={"size": 2}, rules=[
            dict(demo["rules"][0], split={"dim": 0}),  # q/k/v: column parallel, fused per rank
            {"match": "model.layers.*.self_attn.o_proj.weight", "split": {"dim": 1}},
            dict(demo["rules"][1], split={"dim": 0}), {"match": "*"}])
        (home / "demo" / "tp.yaml").write_text(yaml.safe_dump(tp, sort_keys=False))
        yield home, env
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _console_steps(home: Path, env: dict, block: str) -> list[tuple[str, list[str], list[str]]]:
    """(command, the lines the doc shows, the lines planc prints) for each `$ ` line of `block`."""
    import subprocess

    steps, cur = [], None
    for line in block.splitlines():
        if line.startswith("$ "):
            cur = (line[2:], [])
            steps.append(cur)
        else:
            assert cur is not None, f"output before the first command: {line!r}"
            cur[1].append(line.rstrip())
    out = []
    for cmd, want in steps:
        p = subprocess.run(["bash", "-c", "exec 2>&1; " + cmd], cwd=home, env=env, capture_output=True, text=True,
                           timeout=120)
        out.append((cmd, want, [line.rstrip().replace(str(home), "/work/main") for line in p.stdout.splitlines()]))
    return out


@pytest.fixture(scope="module")
def console_home():
    with _console_folder() as got:
        yield got


@pytest.mark.parametrize("block", CONSOLE)
def test_console_example_is_what_planc_prints(console_home, block):
    for cmd, want, got in _console_steps(*console_home, block):
        assert got == want, f"$ {cmd}\n--- the doc shows\n" + "\n".join(want) + "\n--- planc prints\n" + "\n".join(got)


def _rewrite_console_examples() -> None:
    """`python tests/test_docs.py --write`: each checked console block rewritten with what planc prints."""
    with _console_folder() as (home, env):
        for doc in DOCS:
            text = doc.read_text()

            def block(m):
                lines = [x for cmd, _, got in _console_steps(home, env, m.group(1)) for x in [f"$ {cmd}", *got]]
                return "```console checked\n" + "\n".join(lines) + "\n```"

            new = _CONSOLE.sub(block, text)
            if new != text:
                doc.write_text(new)
                print(f"rewrote {doc}")


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python tests/test_docs.py --write")
    _rewrite_console_examples()
