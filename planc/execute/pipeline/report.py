"""Render the measured report next to the plan's predictions."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ...base.errors import printable
from ...base.units import fmt_bytes
from ...plan.explain import limits_text


def render_report(rep, console: Console) -> None:
    """`rep`: a `records.Report`."""
    where = "CUDA simulator" if rep.simulator else rep.device
    gbs = rep.gb_per_s
    console.print(f"[bold]loaded[/bold] {fmt_bytes(rep.payload_bytes)} in {rep.wall_seconds:.3f} s "
                  f"({gbs:.2f} GB/s) on {where}" if gbs is not None else "loaded")
    t = Table(show_edge=False)
    for c in ("", "predicted", "measured"):
        t.add_column(c, justify="left" if not c else "right")
    h, d = rep.host, rep.device_memory
    pw = rep.predicted
    if pw:
        t.add_row("wall (warm / cold)", f"{pw.wall_warm_seconds:.3f} / {pw.wall_cold_seconds:.3f} s"
                  + (" (default costs)" if pw.default_costs else ""), f"{rep.wall_seconds:.3f} s")
    t.add_row("host peak (planc buffers)", fmt_bytes(h.predicted_peak_bytes),
              f"{fmt_bytes(h.growth_bytes)} RSS growth over {fmt_bytes(h.baseline_rss_bytes)} baseline")
    t.add_row("pinned ring", fmt_bytes(h.pinned_bytes), fmt_bytes(h.pinned_bytes))
    t.add_row("device peak", fmt_bytes(d.predicted_peak_bytes),
              fmt_bytes(d.measured_allocated_bytes) if d.measured_allocated_bytes is not None else "n/a (simulator)")
    for name, pred, meas, fmt in (("bytes read", rep.bytes_read.predicted, rep.bytes_read.measured, fmt_bytes),
                                  ("requests", rep.requests.predicted, rep.requests.issued, str),
                                  ("copies", rep.copies.predicted, rep.copies.issued, str),
                                  ("kernels", rep.kernels.predicted, rep.kernels.issued, str)):
        t.add_row(name, fmt(pred), fmt(meas) if meas is not None else "-")
    console.print(t)
    console.print("limits: " + escape(printable(limits_text(rep.limits.as_json()))))
    modes = {}
    for f, m in rep.files.items():
        modes.setdefault(m.why, []).append(f)
    for why, files in sorted(modes.items()):
        console.print(f"reads: {why}: {len(files)} file(s)")
    if rep.verify is not None:
        v = rep.verify
        console.print(f"verify: {v.tensors} tensors, {fmt_bytes(v.bytes)} compared, "
                      f"{'[green]bit-exact[/green]' if v.ok else '[red]MISMATCH[/red]'}")
    if rep.digest is not None:
        d = rep.digest
        console.print(f"digest: {d.extents} extents of {fmt_bytes(d.extent_bytes)} match "
                      f"{escape(printable(d.digest_file))}: {fmt_bytes(d.hashed_bytes)} hashed in the ring, "
                      f"{fmt_bytes(d.fill_bytes)} read besides")
