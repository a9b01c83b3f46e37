"""The main job on the embedded default: write the tiny checkpoint, compile, explain, run, verify.

On a machine without a GPU the run goes through the CUDA simulator (NUMBA_ENABLE_CUDASIM=1),
set here before numba is first imported; the output says which.
"""

from __future__ import annotations

import re
from pathlib import Path

from rich.console import Console
from ..base.codes import Code

from ..base.simulation import choose_simulator
from .prestart import gpu_present

DEFAULT_SPEC = "specs/demo.yaml"
_CHECKPOINT_LINE = re.compile(r"^checkpoint: .*$", re.M)
# The first line of the demo.yaml `planc demo` writes into --workdir from the package's own spec: what
# tells its copy (of any version, which a later run rewrites) from a file of the user's (never replaced).
DEMO_MARK = b"# planc demo: written from the package's specs/demo.yaml; planc demo rewrites this file\n"


def _demo_copy(path: Path) -> bool:
    from .prestart import head

    got = head(path)
    return got is not None and got[1].startswith(DEMO_MARK)


def _find_spec(spec: Path | None) -> tuple[Path, bool]:
    """(the spec, whether it is the copy shipped inside the package).

    The default is looked up in the current folder, then in the checkout the package runs from
    (an editable install), then inside the package (`planc/specs/`, what a wheel ships)."""
    if spec is not None:
        return spec, False
    for base in (Path.cwd(), Path(__file__).resolve().parent.parent.parent):
        p = base / DEFAULT_SPEC
        if p.exists():
            return p, False
    return Path(__file__).resolve().parent.parent / DEFAULT_SPEC, True


def _write_unless_same(folder: Path, family: str):
    """Write the demo checkpoint of `family` into `folder`, leaving files that already hold exactly
    those bytes untouched: a plan compiled against them stays valid (its fingerprints hold the
    files' modification times)."""
    import dataclasses
    import shutil
    import tempfile

    from ..tools.synth import refuse_other_checkpoint, refuse_overwrite, write_checkpoint

    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".planc-demo-") as tmp:
        res = write_checkpoint(Path(tmp), family, seed=0)
        refuse_other_checkpoint(folder, {p.name for p in Path(tmp).iterdir()})
        refuse_overwrite(folder, {p.name for p in Path(tmp).iterdir()})
        for f in sorted(Path(tmp).iterdir()):
            dst = folder / f.name
            if dst.is_file() and not dst.is_symlink() and dst.read_bytes() == f.read_bytes():
                continue
            shutil.move(str(f), str(dst))
    files = tuple(str(folder / Path(x).name) for x in res.files)
    return dataclasses.replace(res, path=str(folder / Path(res.path).name), files=files)


def run_demo(workdir: Path, spec: Path | None, execute_plan: bool, console: Console) -> None:
    from ..compiler.compile import compile_spec
    from ..plan.explain import render

    spec_path, packaged = _find_spec(spec)
    ckpt_dir = spec_path.resolve().parent.parent / "demo" / "dense" if spec is None and not packaged else None
    if ckpt_dir is not None and workdir != Path("demo"):
        console.print(f"(the default spec reads {ckpt_dir}; --workdir is ignored with it)")
    if packaged:  # the package's own copy: checkpoints and the spec go into --workdir, not site-packages
        workdir.mkdir(parents=True, exist_ok=True)
        text = DEMO_MARK + _CHECKPOINT_LINE.sub("checkpoint: dense/model.safetensors", spec_path.read_text(),
                                                count=1).encode()
        spec_path = workdir / "demo.yaml"
        if not (spec_path.is_file() and not spec_path.is_symlink() and spec_path.read_bytes() == text):
            from ..base import outputs  # its own copy is rewritten; a file of the user's is never replaced

            outputs.write(spec_path, text, "demo spec", ours=_demo_copy)
    from ..spec.model import load_spec

    load_spec(spec_path)  # a spec that cannot be read is refused before any checkpoint is written
    target = ckpt_dir or workdir / "dense"
    res = _write_unless_same(target, "dense")
    for family in ("moe", "fp8"):  # the other example specs in specs/ read these
        _write_unless_same(target.parent / family, family)
    console.print(f"[bold]1. checkpoint[/bold]: {res.tensors} tensors, {res.total_bytes:,} bytes -> {res.path}")
    plan = compile_spec(spec_path)
    console.print(f"[bold]2. compile + explain[/bold] {spec_path}")
    render(plan, console)
    if not plan.fits or not execute_plan:
        return
    gpu = gpu_present()
    if not gpu:
        choose_simulator()
    console.print(f"[bold]3. run[/bold] on {'the GPU' if gpu else 'the CUDA simulator (no GPU found)'}, with --verify")
    from ..execute import execute
    from ..execute.pipeline.report import render_report

    model = execute(plan, verify=True)
    try:
        render_report(model.report, console)
        if not model.report.verify.ok:
            from ..base.errors import ExecuteError

            raise ExecuteError(f"verification found mismatches: {model.report.verify.mismatches}",
                               code=Code.VERIFY_MISMATCH)
    finally:
        model.free()
