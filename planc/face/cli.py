"""The `planc` command line (typer + rich).

Exit codes, kept by every command: 0 success, 2 invalid input (spec, manifest, plan, changed file),
3 refused by admission, 130 interrupted, 1 anything else. Errors print one line to stderr, never a traceback
(set PLANC_DEBUG=1 for one).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Optional

import typer

from .. import __version__
from ..base import settings
from . import stdio
from ..base.errors import BindError, PlancError, printable, shorten_words
from .prestart import plan_device_hint
from ..base.units import ascii_int, fmt_bytes, parse_bytes
from ..base.codes import Code

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="planc: compile a checkpoint + placement spec into a load plan that is proven to fit, "
                       "explain it, and run it on the GPU.")
class _Console:
    """A rich Console made at its first use: `planc run --json` never imports rich's console."""

    def __init__(self, **kw):
        self._kw, self._c = kw, None

    def __getattr__(self, name):
        if self._c is None:
            from rich.console import Console

            kw = dict(self._kw)
            stream = sys.stderr if kw.get("stderr") else sys.stdout
            if "COLUMNS" not in os.environ and not _isatty(stream):
                kw["width"] = LOG_WIDTH  # a log or a pipe: tables whole, not cut to 80 columns
            self._c = Console(**kw)
        return getattr(self._c, name)


LOG_WIDTH = 160  # columns of text output that goes to a file or a pipe (COLUMNS, when set, wins)


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def Table(*a, **kw):  # noqa: N802 - rich's Table, imported at its first use
    from rich.table import Table as _Table

    return _Table(*a, **kw)


def escape(text: str) -> str:
    from rich.markup import escape as _escape

    return _escape(text)


out = _Console(emoji=False)
err = _Console(stderr=True, emoji=False)


def _version(value: bool):
    if value:
        print(f"planc {__version__}")
        raise typer.Exit(0)


@app.callback()
def _app_options(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")):
    pass


def _emit_json(doc) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def _gguf_load_summary(meta: dict, by_dtype) -> dict:
    """What planc does with a GGUF file: the transformers model type and shipped spec of its
    architecture (None, with the reason, when planc maps none), and its block types that planc loads
    as stored only."""
    from ..manifest.ggml_types import DEQUANTIZABLE, QUANTIZED
    from ..manifest.gguf_names import ARCHS, arch_of

    try:
        a = arch_of(meta)
        key = next(k for k, v in ARCHS.items() if v is a)
        tf, why = {"model_type": a.model_type, "spec": f"specs/transformers-{_SPEC_NAME.get(key, key)}-gguf.yaml"}, None
    except ValueError as e:
        tf, why = None, str(e)
    return {"transformers": tf, "transformers_unmapped": why,
            "kept_only": sorted(d for d in by_dtype if d in QUANTIZED and d not in DEQUANTIZABLE)}


_SPEC_NAME = {"qwen3moe": "qwen3-moe"}  # an architecture's shipped spec, where its name differs


@app.command()
def inspect(checkpoint: Path = typer.Argument(..., help="A .safetensors file, a folder of shards, or an index json.",
                                             readable=False),
            as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
            top: int = typer.Option(10, help="How many of the largest tensors to list.")):
    """Read a checkpoint's headers (never its data) and summarize it."""
    from ..manifest import read_manifest

    if top < 0:
        raise _usage(f"--top must be 0 or more, got {top}")
    m = read_manifest(checkpoint)
    by_dtype: Counter = Counter()
    count: Counter = Counter()
    per_shard: Counter = Counter()
    for t in m.tensors:
        by_dtype[t.dtype] += t.nbytes
        count[t.dtype] += 1
        per_shard[t.file] += 1
    largest = sorted(m.tensors, key=lambda t: (-t.nbytes, t.name))[:top]
    doc = {
        "source": m.source, "root": m.root,
        "shards": [{"path": s.path, "size_bytes": s.size_bytes, "header_bytes": s.header_bytes,
                    "tensors": per_shard[s.path]} for s in m.shards],
        "tensors": len(m.tensors), "total_bytes": m.total_bytes,
        "header_bytes": sum(s.header_bytes for s in m.shards),
        "by_dtype": {d: {"tensors": count[d], "bytes": by_dtype[d]} for d in sorted(by_dtype)},
        "largest": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "bytes": t.nbytes, "file": t.file}
                    for t in largest],
    }
    if m.format == "gguf":
        meta = dict(m.shards[0].metadata)
        arch = meta.get("general.architecture", "")
        doc["format"] = "gguf"
        doc["gguf"] = {"architecture": arch, "context_length": meta.get(f"{arch}.context_length"),
                       "file_type": meta.get("general.file_type"), "name": meta.get("general.name"),
                       **_gguf_load_summary(meta, by_dtype), "metadata": meta}
    if as_json:
        _emit_json(doc)
        return
    out.print(f"[bold]{escape(printable(m.source))}[/bold]: {len(m.shards)} shard(s), {len(m.tensors)} tensors, "
              f"{fmt_bytes(m.total_bytes)} of data, {fmt_bytes(doc['header_bytes'])} of headers")
    t = Table(show_edge=False)
    for c in ("dtype", "tensors", "bytes"):
        t.add_column(c, justify="left" if c == "dtype" else "right")
    for d, v in doc["by_dtype"].items():
        t.add_row(d, str(v["tensors"]), fmt_bytes(v["bytes"]))
    out.print(t)
    if "gguf" in doc:
        g = doc["gguf"]
        out.print(f"GGUF: architecture {escape(printable(g['architecture'] or '?'))}, context length "
                  f"{g['context_length'] or '?'}, file type {g['file_type'] or '?'} "
                  f"(quantization: {', '.join(sorted(doc['by_dtype']))})")
        tf = g["transformers"]
        out.print(f"  into transformers: {tf['model_type']} with the shipped spec {tf['spec']}" if tf else
                  f"  into transformers: {escape(printable(g['transformers_unmapped']))}")
        if g["kept_only"]:
            out.print(f"  planc loads {', '.join(g['kept_only'])} blocks as stored only (dtype: keep): it does not "
                      f"dequantize them")
    t = Table(title=f"largest {len(largest)}", show_edge=False)
    for c in ("name", "dtype", "shape", "bytes"):
        t.add_column(c, justify="right" if c == "bytes" else "left")
    for x in doc["largest"]:
        t.add_row(escape(printable(x["name"])), x["dtype"], str(x["shape"]), fmt_bytes(x["bytes"]))
    out.print(t)


@app.command()
def schema():
    """Print the placement spec's JSON Schema."""
    from ..spec.model import json_schema

    _emit_json(json_schema())


@app.command()
def synth(out_dir: Path = typer.Argument(..., help="Folder to write the checkpoint into.", readable=False),
          family: str = typer.Option("dense", help="dense | moe | fp8 | mxfp4 | nvfp4 | gguf"),
          quant: str = typer.Option("Q8_0", help="gguf: Q8_0, Q4_K_M, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, F16, BF16 or F32."),
          size: Optional[str] = typer.Option(None, help="Approximate size, e.g. 2GiB (default: tiny)."),
          shards: int = typer.Option(1, help="Number of shard files."),
          sparse: bool = typer.Option(False, help="Header plus a hole: size-only work, no disk."),
          layers: Optional[int] = typer.Option(None, help="Number of layers (default: from --size, else 2)."),
          experts: Optional[int] = typer.Option(None, help="Experts per layer (moe)."),
          dtype: str = typer.Option("BF16", help="Dtype of the weights: BF16, F16 or F32 (dense, moe)."),
          seed: int = typer.Option(0),
          force: bool = typer.Option(False, "--force", help="Replace checkpoint files in OUT_DIR that planc synth did not write."),
          as_json: bool = typer.Option(False, "--json")):
    """Write a synthetic safetensors checkpoint (real files) for tests, demos and benchmarks.

    Files already in OUT_DIR are replaced only when planc synth wrote them (or with --force)."""
    from ..tools.synth import write_checkpoint

    try:
        size_bytes = parse_bytes(size) if size else None
    except ValueError as e:
        raise _usage(f"--size: {e}")
    if size_bytes is not None and size_bytes <= 0:
        raise _usage(f"--size must be positive, got {printable(size)[:40]!r}")
    if seed < 0:
        raise _usage(f"--seed must be 0 or more, got {seed}")
    if family not in ("dense", "moe", "fp8", "mxfp4", "nvfp4", "gguf"):
        raise _usage(f"--family must be dense, moe, fp8, mxfp4, nvfp4 or gguf, got {family!r}")
    if out_dir.exists() and not out_dir.is_dir():
        raise _usage(f"OUT_DIR {out_dir} is a file, not a folder; give a new or empty folder")
    if family == "gguf":
        return _synth_gguf(out_dir, quant, size_bytes, layers, seed, as_json)
    if family in ("mxfp4", "nvfp4"):
        return _synth_fp4(out_dir, family, size_bytes, shards, sparse, layers, experts, seed, as_json)
    try:
        res = write_checkpoint(out_dir, family, size_bytes=size_bytes, shards=shards, sparse=sparse, seed=seed,
                               layers=layers, experts=experts, dtype=dtype, force=force)
    except ValueError as e:  # bad --shards, a folder holding another checkpoint, ...
        raise _usage(str(e)) from None
    except OSError as e:  # a parent that is a file, no permission, a full disk
        raise _usage(f"OUT_DIR {out_dir}: cannot write the checkpoint ({e.strerror or e})") from None
    doc = {"path": str(res.path), "files": [str(f) for f in res.files], "tensors": res.tensors,
           "total_bytes": res.total_bytes}
    if as_json:
        _emit_json(doc)
    else:
        out.print(f"wrote {res.tensors} tensors, {fmt_bytes(res.total_bytes)} in {len(res.files)} file(s): {res.path}")


def _synth_fp4(out_dir, family, size_bytes, shards, sparse, layers, experts, seed, as_json) -> None:
    from ..tools.synth_fp4 import write_fp4_checkpoint

    if shards != 1 or sparse:
        raise _usage(f"--family {family} writes one file with data: no --shards, no --sparse")
    try:
        path, _, n, total = write_fp4_checkpoint(out_dir, family, layers=layers, size_bytes=size_bytes,
                                                 experts=experts, seed=seed)
    except ValueError as e:
        raise _usage(str(e)) from None
    except OSError as e:
        raise _usage(f"OUT_DIR {out_dir}: cannot write the checkpoint ({e.strerror or e})") from None
    if as_json:
        _emit_json({"path": path, "files": [path], "tensors": n, "total_bytes": total})
    else:
        out.print(f"wrote {n} tensors, {fmt_bytes(total)} in 1 file(s): {path}")


def _synth_gguf(out_dir: Path, quant: str, size_bytes, layers, seed: int, as_json: bool) -> None:
    from ..tools.synth_gguf import write_gguf

    try:
        res = write_gguf(out_dir, quant=quant, size_bytes=size_bytes, layers=layers, seed=seed)
    except ValueError as e:
        raise _usage(str(e)) from None
    except OSError as e:
        raise _usage(f"OUT_DIR {out_dir}: cannot write the checkpoint ({e.strerror or e})") from None
    doc = {"path": res.path, "files": [res.path], "tensors": res.tensors, "total_bytes": res.total_bytes,
           "quant": res.quant, "layers": res.layers}
    if as_json:
        _emit_json(doc)
    else:
        out.print(f"wrote {res.tensors} tensors ({res.quant}), {fmt_bytes(res.total_bytes)}: {res.path}")


@app.command()
def probe(folder: Path = typer.Argument(Path("."), help="Scratch folder, on the disk the checkpoints live on.",
                                        readable=False),
          size: str = typer.Option("1GiB", help="Scratch file size (at least 64MiB)."),
          workers: int = typer.Option(16, min=1, max=256, help="Reader threads (as io.workers)."),
          repeat: int = typer.Option(3, min=1, max=20, help="Timings per figure (the median is kept)."),
          output: Optional[Path] = typer.Option(None, "-o", "--output", help="Where to keep the figures "
                                                "(default: $PLANC_PROBE, else ~/.cache/planc/io-probe.json).",
                                                readable=False),
          link: bool = typer.Option(True, "--link/--no-link", help="Also measure the pinned host -> device link "
                                    "of --device (where it is a GPU, not the simulator)."),
          device: str = typer.Option("cuda:0", "--device", help="The GPU whose link is measured (cuda or cuda:N)."),
          as_json: bool = typer.Option(False, "--json")):
    """Measure the I/O cost figures that choose how row-parallel slices are read, and the link to the
    GPU; compile uses them, and the predicted wall and the reports' limits follow."""
    from ..base import outputs
    from ..plan.costs import probe_path
    from ..tools.probe import MIN_SIZE, is_probe_file, measure, save

    try:
        size_bytes = parse_bytes(size)
    except ValueError as e:
        raise _usage(f"--size: {e}")
    if size_bytes < MIN_SIZE:
        raise _usage(f"--size {printable(size)[:40]} is below the probe's minimum, 64MiB ({MIN_SIZE:,} bytes)")
    if folder.exists() and not folder.is_dir():
        raise _usage(f"FOLDER {folder} is a file, not a folder")
    if not folder.is_dir():
        raise _usage(f"FOLDER {folder} does not exist: give a folder on the disk the checkpoints live on")
    if not _DEVICE_NAME.fullmatch(device):
        raise _usage(f"--device {printable(device)[:40]}: expected cuda or cuda:N")
    dest = output or probe_path()
    if os.path.lexists(dest) or dest.parent.is_dir():  # refused before a minute of measuring
        outputs.target(dest, "probe output", ours=is_probe_file)
    if link:  # the driver calls follow the settings: a bad PLANC_* variable is exit 2 before a minute of measuring
        from ..execute.pipeline.run import resolve_settings

        resolve_settings(None)
    gpu, no_link = _link_device(device) if link else (None, "not asked (--no-link)")
    try:
        doc = measure(folder, size_bytes, workers, repeat, link=gpu)
        where = save(doc, output)
    except OSError as e:
        raise _usage(f"{folder}: cannot write the probe's scratch file or its result ({e.strerror or e})") from None
    doc["saved"] = str(where)
    if gpu is None:
        doc["link"] = {"measured": False, "why": no_link}
    if as_json:
        _emit_json(doc)
        return
    w, c = doc["warm"], doc["cold"]
    out.print(f"mapped strided reads: {w['mapped_small_gbps']:.2f} GB/s (1 KiB every 8 KiB), "
              f"{w['mapped_large_gbps']:.2f} GB/s (64 KiB every 128 KiB); whole rows {w['rows_gbps']:.2f} GB/s warm, "
              f"{c['rows_gbps']:.2f} GB/s cold" + (f", {c['disk_gbps']:.2f} GB/s cold with O_DIRECT" if "disk_byte_s" in doc
                                                   and c.get("disk_direct") else f", {c['disk_gbps']:.2f} GB/s disk"
                                                   if "disk_byte_s" in doc else " (page cache not dropped: no disk figure)"))
    lk = doc["link"]
    out.print(f"link to {device}: {lk['link_gbps']:.2f} GB/s pinned host -> device ({fmt_bytes(lk['link_copy_bytes'])} "
              f"copies)" if "link_byte_s" in doc else f"link: not measured, {lk['why']}: plans keep the built-in "
              "55.4 GB/s")
    out.print(f"page {w['page_s'] * 1e9:.1f} ns, copy {w['copy_byte_s'] * 1e12:.2f} ps/B, read {w['read_byte_s'] * 1e12:.2f} "
              f"ps/B, request {w['request_s'] * 1e6:.2f} us; saved to {where}")


_DEVICE_NAME = re.compile(r"cuda(:[0-9]{1,4})?")


def _link_device(name: str):
    """(the device whose link `planc probe` measures, selected, or None; why not, where None)."""
    from ..execute.device import seam

    dev = seam.default_device()
    if dev.simulated:
        return None, "the device is simulated (NUMBA_ENABLE_CUDASIM=1)"
    try:
        seam.select(name)
        dev.memory_info()  # the device is there, its context made
    except (PlancError, OSError) as e:
        return None, f"no GPU {name} ({printable(str(e).split(';')[0])[:200]})"
    return dev, None


class _Usage(PlancError):
    exit_code = 2
    default_code = Code.USAGE


def _usage(msg: str) -> _Usage:
    return _Usage(msg)


def _rank(opt: Optional[str], size: int, launch=None, allow_all: bool = False, where: str = ""):
    """The rank to compile or run: --rank (an integer, or `all` where allowed), else $RANK, else 0 when
    there is one rank (`planc.face.target.pick_rank`, which the Python API asks too)."""
    from .target import Launch, pick_rank

    launch = Launch.from_env() if launch is None else launch
    if opt is None:
        r = None
    elif allow_all and opt == "all":
        return "all"
    else:
        r = ascii_int(opt)
        if r is None:
            raise BindError(f"--rank must be an integer{' or all' if allow_all else ''}, got {printable(opt)[:40]!r}",
                            code=Code.BAD_RANK)
    return pick_rank(r, size, launch, all_hint=" or --rank all" if allow_all else "", where=where)


def _is_plan(path: Path) -> bool:
    from .target import is_plan

    return is_plan(path)


def _load_plan_or_spec(path: Path, rank: Optional[str] = None, launch=None):
    """The plan `path` names (`planc.face.target.resolve`, as for the Python API), for --rank."""
    from .target import Launch, resolve

    launch = Launch.from_env() if launch is None else launch
    if rank is not None:
        r = ascii_int(rank)
        if r is None:
            raise BindError(f"--rank must be an integer, got {printable(rank)[:40]!r}", code=Code.BAD_RANK)
        rank = r
    return resolve(path, rank, launch=launch)


def _writable_file(path: Path, flag: str) -> None:
    """Refuse, before any work, an output path that cannot be written: a folder, a missing folder, no permission."""
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise _usage(f"{flag} {path} is a folder; give a file name")
    if not parent.is_dir():
        raise _usage(f"{flag} {path}: folder {parent} does not exist")
    if not os.access(path if path.exists() else parent, os.W_OK):
        raise _usage(f"{flag} {path}: not writable")


def _inputs(plan, *paths) -> list:
    """What a command read: the paths given (its spec or plan) and the plan's checkpoint files.
    No output may be one of them (`planc.base.outputs`)."""
    root = Path(plan.checkpoint.root)
    return [p for p in paths if p is not None] + [root / f.path for f in plan.checkpoint.files]


def _write_output(path: Path, data, flag: str, inputs) -> None:
    """Write an output file through `planc.base.outputs` (atomic; never a device, a FIFO or an input)."""
    from ..base import outputs

    outputs.write(path, data, flag, inputs=inputs)


def _rank_files(folder: Path, plans, spec: Path) -> None:
    """Every `rank-K.json` that `--rank all -o FOLDER` writes, checked before any is written: the user
    named the folder, not the files in it, so each is new or a plan planc wrote there (never a link
    out of the folder, a file of other content, a FIFO or an input)."""
    from ..base import outputs
    from ..base.outputs import OutputError
    from .filekind import is_written_plan

    for k, plan in enumerate(plans):
        path = folder / f"rank-{k}.json"
        if path.is_symlink():
            raise OutputError(f"-o {printable(str(path))}: is a symbolic link; --rank all writes its own rank-K.json "
                              f"files in the folder it is given, never through a link", code=Code.OUTPUT_NOT_OURS)
        outputs.target(path, "-o", inputs=_inputs(plan, spec), ours=is_written_plan)


def _write(path: Path, flag: str, write) -> None:
    try:
        write()
    except OSError as e:  # a full disk (/dev/full), a file system gone read-only
        raise _usage(f"{flag} {path}: cannot write ({e.strerror or e})") from None


def _all_ranks(spec: Path):
    from ..compiler.compile import compile_all_ranks

    return compile_all_ranks(spec)


@app.command("compile")
def compile_cmd(spec: Path = typer.Argument(..., help="Placement spec (YAML or JSON).", readable=False),
                output: Optional[Path] = typer.Option(None, "-o", "--output", readable=False,
                                                      help="Write the plan JSON here (a folder with --rank all)."),
                rank: Optional[str] = typer.Option(None, "--rank", help="Tensor-parallel rank R, or `all` (default: $RANK, else 0)."),
                as_json: bool = typer.Option(False, "--json", help="Print the explanation as JSON.")):
    """Compile a spec into a plan; exit 0 when admitted, 3 when refused (with the reason)."""
    from ..compiler.compile import compile_spec
    from ..plan.explain import explain_doc, render
    from ..plan.codec import encode_bytes
    from ..spec.model import load_spec

    size = load_spec(spec).spec.tensor_parallel.size
    r = _rank(rank, size, allow_all=True, where=str(spec))
    if r == "all":
        if output is not None:
            if output.exists() and not output.is_dir():
                raise _usage(f"-o {output} is a file; --rank all writes rank-K.json files into a folder")
            _write(output, "-o", lambda: output.mkdir(parents=True, exist_ok=True))
        plans = _all_ranks(spec)
        if output is not None:
            _rank_files(output, plans, spec)
            for k, plan in enumerate(plans):
                _write_output(output / f"rank-{k}.json", encode_bytes(plan), "-o", _inputs(plan, spec))
        refused = [p for p in plans if not p.fits]
        nodes = _nodes(spec, plans)
        node_refused = _first_refused(nodes)
        if as_json:
            _emit_json(_ranks_doc(plans, nodes))
        else:
            # the table on stdout whatever the outcome; a refusal adds its one line on stderr
            _rank_table(plans, out)
            if size > 1:
                from ..plan.explain import render_nodes

                render_nodes(nodes, out)
        if refused:
            ref = refused[0].refusal
            k = refused[0].tensor_parallel.rank
            _say(f"planc: rank {k}: {ref.message} [{ref.code}]")
            raise typer.Exit(3)
        if node_refused:
            from ..plan.node import node_refusal

            r = node_refusal(node_refused)
            _say(f"planc: {r.message} [{r.code}]")
            raise typer.Exit(3)
        return
    if output is not None:
        from ..base import outputs

        _writable_file(output, "-o")
        outputs.target(output, "-o", inputs=[spec])  # before the compile: never the spec itself
    plan = compile_spec(spec, r)
    if output:
        _write_output(output, encode_bytes(plan), "-o", _inputs(plan, spec))
    if as_json:
        _emit_json(explain_doc(plan))
    elif not plan.fits:  # the explanation is output (stdout); the error stays one line on stderr
        render(plan, out)
    else:
        t = plan.totals
        out.print(f"admitted: {t.tensors} tensors, {fmt_bytes(t.read_bytes)} in {t.runs} runs; host peak "
                  f"{fmt_bytes(plan.peak.host_bytes)} of {fmt_bytes(plan.budget.host_bytes)}"
                  + (f" (rank {r} of {size})" if size > 1 else "")
                  + (f"; plan written to {output}" if output else ""))
    if not plan.fits:
        _say(f"planc: {plan.refusal.message} [{plan.refusal.code}]")
        raise typer.Exit(3)


def _nodes(spec: Path, plans, complete: bool = False):
    from ..compiler.compile import node_checks

    return node_checks(spec, plans, complete)


def _first_refused(nodes):
    from ..plan.node import first_refused

    return first_refused(nodes)


def _ranks_doc(plans, nodes) -> dict:
    """`--rank all --json`: each rank's explanation (with its node's check) and the nodes."""
    from ..plan.explain import explain_doc
    from ..plan.node import node_of

    by_node = {n.node: n for n in nodes}
    per = len(nodes[0].ranks) if nodes else 1
    return {"ranks": [explain_doc(p, by_node.get(node_of(p.tensor_parallel.rank, per))) for p in plans],
            "nodes": [n.as_dict() for n in nodes]}


def _rank_table(plans, console) -> None:
    t = Table(title="ranks", show_edge=False)
    for c in ("rank", "tensors", "bytes read", "payload", "requests", "copies", "host peak", "device peak", "fits"):
        t.add_column(c, justify="right")
    for p in plans:
        tot, pk = p.totals, p.peak
        t.add_row(str(p.tensor_parallel.rank), str(tot.tensors), fmt_bytes(tot.read_bytes),
                  fmt_bytes(tot.payload_bytes), str(tot.requests), str(tot.copies),
                  fmt_bytes(pk.host_bytes), fmt_bytes(pk.device_bytes), "yes" if p.fits else "REFUSED")
    console.print(t)


@app.command()
def explain(target: Path = typer.Argument(..., help="A spec, or a plan JSON written by compile.", readable=False),
            rank: Optional[str] = typer.Option(None, "--rank", help="Tensor-parallel rank R, or `all` for every rank."),
            host: Optional[str] = typer.Option(None, "--host", help="Replay against this host budget instead (e.g. 4GiB)."),
            device_budget: Optional[str] = typer.Option(None, "--device",
                                                        help="Replay against this device budget instead (e.g. 80GiB)."),
            as_json: bool = typer.Option(False, "--json", help="Machine-readable output (a contract for scripts)."),
            verify_digest: Optional[str] = typer.Option(None, "--verify-digest", metavar="[FILE]",
                                                        help="Say what verifying the load against this digest file "
                                                             "(default: the checkpoint's) reads and hashes.")):
    """Explain where every byte of the budgets goes: peaks, headroom, runs, contributors, refusal.

    With --host or --device the plan is replayed against those budgets; exit 3 when it would not fit."""
    from ..plan.explain import explain_doc, render

    budgets = _budgets(host, device_budget)
    if rank == "all" and not _is_plan(target):
        plans = [_rebudget(p, budgets) for p in _all_ranks(target)]
        nodes = _nodes(target, plans)
        if as_json:
            _emit_json(_ranks_doc(plans, nodes))
        else:
            from ..plan.explain import render_nodes
            from ..plan.node import node_of

            by_node = {n.node: n for n in nodes}
            per = len(nodes[0].ranks) if nodes else 1
            for p in plans:
                out.rule(f"rank {p.tensor_parallel.rank} of {p.tensor_parallel.size}")
                render(p, out, by_node.get(node_of(p.tensor_parallel.rank, per)))
            _rank_table(plans, out)
            if plans and plans[0].tensor_parallel.size > 1:
                render_nodes(nodes, out)
        if budgets and any(not p.fits for p in plans):
            raise typer.Exit(3)
        return
    plan = _rebudget(_load_plan_or_spec(target, rank), budgets)
    node = None
    if plan.tensor_parallel.size > 1 and not _is_plan(target):  # a spec: its node mates are compiled too
        node = next(iter(_nodes(target, [plan], complete=True)), None)
    verification = _verification(plan, verify_digest)
    if as_json:
        _emit_json({**explain_doc(plan, node), "verification": verification})
    else:
        render(plan, out, node)
        if verify_digest is not None:
            out.print(_verification_line(verification), markup=False, highlight=False)
    if budgets and not plan.fits:
        _say(f"planc: {plan.refusal.message} [{plan.refusal.code}]")
        raise typer.Exit(3)


def _budgets(host: Optional[str], device: Optional[str]) -> dict:
    out = {}
    for flag, v, key in (("--host", host, "host_bytes"), ("--device", device, "device_bytes")):
        if v is None:
            continue
        try:
            out[key] = parse_bytes(v)
        except ValueError as e:
            raise _usage(f"{flag}: {e}") from None
    return out


def _rebudget(plan, budgets: dict):
    """The plan replayed against other budgets (the same replay admission and re-admission use)."""
    if not budgets:
        return plan
    from ..plan.admission import admit

    p = plan.with_budget(**budgets)
    return p.with_decision(admit(p))


@app.command()
def run(target: Path = typer.Argument(..., help="A spec, or a plan JSON written by compile.", readable=False),
        rank: Optional[str] = typer.Option(None, "--rank", help="Tensor-parallel rank (default: $RANK, else 0)."),
        device: Optional[str] = typer.Option(None, "--device",
                                             help="Device to load onto (default: cuda:$LOCAL_RANK when set, else the spec's)."),
        as_json: bool = typer.Option(False, "--json", help="Print the measured report as JSON (no progress bar)."),
        report: Optional[str] = typer.Option(None, "--report",
                                             help="Also write the JSON report to this file; `{rank}` is replaced by the rank."),
        verify: bool = typer.Option(False, "--verify", help="Compare every loaded tensor with the checkpoint, chunk by chunk."),
        verify_digest: Optional[str] = typer.Option(None, "--verify-digest", metavar="[FILE]",
                                                    help="Hash every byte read as it streams and compare with the digest "
                                                         "file FILE (default: the one planc digest writes beside the "
                                                         "checkpoint); a mismatch is exit 2 and no model.")):
    """Execute a plan on the GPU (or the CUDA simulator) and report measured against predicted."""
    # No BLAS work happens in a load: numpy's import need not start a BLAS thread per core (0.07-0.1 s
    # of a 16-core machine's process start). A value the user set is kept.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from ..base.device import check_device

    if report is not None and not report.strip():  # before anything is read: `--report ""` is not "no report"
        raise _usage("--report needs a file name, got an empty one")
    if device is not None:
        try:
            check_device(device)
        except ValueError as e:
            raise _usage(f"--device {e}") from None
    from ..execute.device import seam

    # The driver starts while the executor is imported and the plan read (the device's context too,
    # where --device or LOCAL_RANK names it already, or the saved plan does).
    from .target import Launch

    launch = Launch.from_env()  # the launcher's variables, read once for this command
    local = launch.local_rank
    seam.prewarm(device or (f"cuda:{local}" if local is not None else plan_device_hint(target)))
    from ..base.errors import ExecuteError, Interrupted
    from ..execute import execute
    plan = _load_plan_or_spec(target, rank, launch)
    if not plan.fits:
        raise _refused(plan)
    if device is None and local is not None:
        device = f"cuda:{local}"
    report_path = None
    if report is not None:
        report_path = Path(report.replace("{rank}", str(_report_rank(plan, launch))))
        _writable_file(report_path, "--report")
        from ..base import outputs

        outputs.target(report_path, "--report", inputs=_inputs(plan, target))  # before the load
    progress = not as_json and sys.stderr.isatty()
    with _SigintSeen() as sigint:
        model = execute(plan, progress=progress, verify=verify, device=device, digest=_digest_arg(verify_digest))
    if sigint.seen:  # the KeyboardInterrupt was raised where Python drops exceptions, and the load went on
        model.free()
        raise Interrupted("interrupted during the load; everything allocated was released")
    try:
        if report_path is not None:
            text = json.dumps(model.report.as_json(), indent=2, sort_keys=True)
            _write_output(report_path, text, "--report", _inputs(plan, target))
        if as_json:
            _emit_json(model.report.as_json())
        else:
            from ..execute.pipeline.report import render_report

            render_report(model.report, out)
    finally:
        model.free()
    v = model.report.verify
    if v is not None and not v.ok:
        raise ExecuteError(f"--verify found {len(v.mismatches)} mismatching part(s): {', '.join(v.mismatches[:5])}",
                           code=Code.VERIFY_MISMATCH)


def _digest_arg(value: Optional[str]):
    """--verify-digest [FILE]: None (not asked), True (the checkpoint's default digest file) or FILE."""
    if value is None:
        return None
    return True if value == "" else value


def _verification(plan, value: Optional[str]) -> dict:
    """What `explain` says of verification: none, or what a digest check of this plan costs."""
    if value is None:
        return {"kind": "none"}
    from ..manifest.digest import find_default, read_digest
    from ..manifest.digestcheck import Verifier, coverage

    path = find_default(plan.checkpoint) if value == "" else value
    d = read_digest(path)
    v = Verifier(plan, d)  # every file in the digest, of the same size; the leaves' owners proved
    return {"kind": "digest", "digest_file": str(path), **coverage(plan, d.extent_bytes, d.leaf_bytes, v.assigned)}


def _verification_line(v: dict) -> str:
    if v["kind"] == "none":
        return ("verified: no (planc run --verify-digest hashes every byte as it streams, against a digest file "
                "from planc digest; --verify compares after the load)")
    return (f"verified: yes, against {printable(v['digest_file'])}: {v['extents_verified']} of {v['extents']} extents "
            f"of {fmt_bytes(v['extent_bytes'])} hashed as they stream, {fmt_bytes(v['fill_bytes'])} read besides the "
            f"plan's (the bytes of those extents' leaves that no read or only part of a read holds), "
            f"{v['shared_leaves']} {'leaf' if v['shared_leaves'] == 1 else 'leaves'} more than one read holds (each "
            f"read's bytes compared), {v['extents_untouched']} extents not loaded and not checked")


@app.command()
def digest(checkpoint: Path = typer.Argument(..., help="A .safetensors file, a folder of shards, or an index json.",
                                             readable=False),
           output: Optional[Path] = typer.Option(None, "-o", "--output", readable=False,
                                                 help="Where to write the digest file (default: beside the "
                                                      "checkpoint, where run --verify-digest looks)."),
           extent: str = typer.Option("16MiB", "--extent", help="Extent size: a power of two, 64KiB to 1GiB."),
           leaf: Optional[str] = typer.Option(None, "--leaf", help="Leaf size: a power of two from 64KiB to the "
                                                                     "extent (default 16MiB, or the extent if smaller)."),
           sha256: bool = typer.Option(False, "--sha256", help="Also each file's sha256 (what the Hugging Face hub "
                                                                "records for an LFS file)."),
           workers: int = typer.Option(4, min=1, max=64, help="Files hashed at once."),
           as_json: bool = typer.Option(False, "--json", help="Print a summary as JSON.")):
    """Write a digest file for a checkpoint: per file its size and head, per extent an xxh3-128 over its leaves'."""
    from ..manifest import digest as _digest
    from ..manifest import read_manifest

    try:
        extent_bytes = parse_bytes(extent)
    except ValueError as e:
        raise _usage(f"--extent: {e}") from None
    try:
        leaf_bytes = None if leaf is None else parse_bytes(leaf)
    except ValueError as e:
        raise _usage(f"--leaf: {e}") from None
    m = read_manifest(checkpoint)
    dest = output or _digest.default_path(str(checkpoint), m.root)
    # the index files of a folder are inputs too; an existing output is replaced only when it is a digest
    inputs = [checkpoint] + [Path(m.root) / s.path for s in m.shards] + sorted(Path(m.root).glob("*.index.json"))
    from ..base import outputs

    outputs.target(dest, "-o", inputs=inputs, ours=_digest.is_digest_file)  # before a minute of hashing
    doc = _digest.make_digest(checkpoint, extent_bytes=extent_bytes, leaf_bytes=leaf_bytes, sha256=sha256,
                              workers=workers)
    where = outputs.write(dest, _digest.encode(doc), "-o", inputs=inputs,
                          ours=_digest.is_digest_file)
    summary = {"path": str(where), "files": len(doc["files"]), "extent_bytes": extent_bytes,
               "leaf_bytes": doc["leaf_bytes"],
               "extents": sum(len(f["extents"]) for f in doc["files"]),
               "bytes": sum(f["size_bytes"] for f in doc["files"]), "sha256": sha256}
    if as_json:
        _emit_json(summary)
    else:
        out.print(f"digest of {summary['files']} file(s), {fmt_bytes(summary['bytes'])} in {summary['extents']} extents "
                  f"of {fmt_bytes(extent_bytes)}{' (with sha256)' if sha256 else ''}: {printable(str(where))}",
                  markup=False, highlight=False)


def _report_rank(plan, launch) -> int:
    """`{rank}` in --report: the tensor-parallel rank, or for a data-parallel replica its $RANK."""
    tp = plan.tensor_parallel
    if tp.size > 1:
        return tp.rank
    return launch.rank if launch.rank is not None else 0


class _SigintSeen:
    """Ctrl-C during a load raises KeyboardInterrupt, as by default, and is also remembered: Python drops
    an exception raised inside a weakref callback or a `__del__`, and the load would otherwise end as if
    never interrupted."""

    seen = False

    def __enter__(self):
        try:
            self._old = signal.signal(signal.SIGINT, self._on)
        except ValueError:  # not the main thread: the process's signals are not ours
            self._old = False
        return self

    def _on(self, signum, frame):
        self.seen = True
        raise KeyboardInterrupt

    def __exit__(self, *exc):
        if self._old is not False:
            signal.signal(signal.SIGINT, self._old if self._old is not None else signal.default_int_handler)
        return False


def _refused(plan):
    from ..base.errors import AdmissionError

    return AdmissionError.of(plan.refusal)


@app.command()
def demo(workdir: Path = typer.Option(Path("demo"), help="Where the demo checkpoint is written."),
         spec: Optional[Path] = typer.Option(None, help="Spec to use (default: specs/demo.yaml).", readable=False),
         execute_plan: bool = typer.Option(True, "--run/--no-run", help="Also execute the plan.")):
    """The main job on an embedded default: write a small checkpoint, compile, explain and run it."""
    from .demo import run_demo

    try:
        run_demo(workdir, spec, execute_plan, out)
    except ValueError as e:  # a demo folder that holds another checkpoint's files
        raise _usage(str(e)) from None


def _say(line: str) -> None:
    """One line on stderr, whatever the message quotes: names from a checkpoint may hold newlines,
    terminal escapes or unpaired surrogates, and are shown escaped; very long names are shortened."""
    err.print(shorten_words(printable(line)), markup=False, highlight=False, soft_wrap=True)


def _optional_values(argv: list) -> list:
    """`--verify-digest` with no FILE (last, or before another option) -> `--verify-digest=`."""
    return [a + "=" if a == "--verify-digest" and (i + 1 == len(argv) or argv[i + 1].startswith("-")) else a
            for i, a in enumerate(argv)]


def main(argv=None) -> int:
    """Run one command; its exit code. stdout is guarded (`planc.face.stdio`): a closed or full stdout is
    one line and exit 2, a pipe whose reader has gone exit 141 without a word."""
    with stdio.guarded():
        rc = _main(argv)
        try:
            sys.stdout.flush()  # buffered output: a full disk shows here, not at the exit
        except stdio.PipeClosed as e:
            return e.exit_code
        except stdio.OutputError as e:
            _say(f"planc: {e.message} [{e.code}]")
            return rc or e.exit_code
        return rc


def _main(argv) -> int:
    argv = _optional_values(list(sys.argv[1:] if argv is None else argv))
    try:
        rc = app(args=argv, prog_name="planc", standalone_mode=False)
        if rc == 130:  # typer turns a KeyboardInterrupt inside a command into 130, without a word
            _say("planc: interrupted")
        return rc if isinstance(rc, int) else 0  # a command's typer.Exit(n) comes back as n here
    except stdio.PipeClosed as e:  # the reader of stdout has gone: nothing to say, and nobody to say it to
        return e.exit_code
    except PlancError as e:
        _say(f"planc: {e.message} [{e.code}]")
        if settings.debug():
            raise
        return e.exit_code
    except typer.Exit as e:
        return e.exit_code
    except SystemExit as e:
        return int(e.code or 0)
    except KeyboardInterrupt:
        err.print("planc: interrupted")
        return 130
    except Exception as e:  # noqa: BLE001 - the last line of defence: one line, exit 1
        if type(e).__name__ == "NoArgsIsHelpError":  # `planc` or `planc COMMAND` alone: the help
            e.show()
            return 2
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):  # a usage error from the argument parser
            ctx = getattr(e, "ctx", None)
            where = ctx.command_path if ctx is not None else "planc"
            _say(f"planc: {e.format_message()} (see {where} --help) [{Code.USAGE}]")
            return 2
        if isinstance(e, BrokenPipeError):  # a write to a closed pipe past the guard (a library's own stream)
            return stdio.PipeClosed.exit_code
        if settings.debug():
            raise
        _say(f"planc: unexpected error: {type(e).__name__}: {e} (PLANC_DEBUG=1 shows the traceback)")
        return 1


def entry() -> None:
    _exit(main())


def _exit(rc: int) -> None:
    """Leave the process without tearing the interpreter down.

    After `compile` at 90k tensors the process holds millions of small records (the manifest, the
    plan); the interpreter's teardown frees them one at a time and walks them all in a last
    collection: 0.25-0.3 s of a 2 s command, spent on memory the system takes back at once anyway.
    Exit handlers run and the standard streams are flushed first, as at an ordinary exit; while
    other threads still run, the ordinary exit takes over.
    A ring still being unpinned after a load (`seam.release_later`) is left to the exit, which
    gives the memory back at once; on the ordinary exit it is waited for.
    """
    import atexit
    import threading

    driver, seam = sys.modules.get("planc.execute.device.driver"), sys.modules.get("planc.execute.device.seam")
    if driver is not None:  # the driver's head start (`planc run --help`, a usage error): let it finish,
        driver.wait_started()  # never leave the driver half started to the exit
    unpinning = []
    if seam is not None:  # a finished load's ring being unpinned: the exit gives that memory back at once
        seam.leave_released_to_exit()
        unpinning = seam.unpinning()
    others = [t for t in threading.enumerate() if t is not threading.current_thread() and t not in unpinning]
    if not others:
        atexit._run_exitfuncs()  # and forgets them: the ordinary exit below would not run them twice
        # A stream that cannot be flushed (closed, full, a pipe nobody reads) has nowhere to put the
        # rest: the ordinary exit would only fail the same flush again, print "Exception ignored"
        # and change the exit code.
        stdio.flush_quietly()
        os._exit(rc)
    if seam is not None:
        seam.settle_released()  # the ordinary exit: no unpinning thread outlives the driver's own teardown
    sys.exit(rc)
