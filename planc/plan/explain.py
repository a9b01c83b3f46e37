"""explain: Plan -> the budget explained, as a JSON-ready dict (a contract for scripts) or rich text.

Both forms read the plan's own timeline, the same one admission decided on.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .costs import DEFAULTS, ROWS_MARGIN, choose
from ..base.errors import printable
from .admission import dominant_step
from .records import Plan
from .predict import limits, predict
from ..base.units import fmt_bytes
from .verifycost import verify_chunk, verify_host_bytes

TOP = 10


def explain_doc(plan: Plan, node=None) -> dict:
    """The explanation as plain JSON-ready values (the `explain --json` contract). `node`: the
    `node.NodeCheck` of this rank's node, when the plan is one rank of a tensor-parallel spec."""
    windows = {w.run: w for w in plan.timeline}
    parts, lay, budget, peak = plan.parts, plan.layout, plan.budget, plan.peak
    runs = []
    for r in plan.runs:
        w = windows.get(r.index)
        runs.append({
            "index": r.index,
            "tensors": len({parts[p].tensor for p in r.parts}),
            "parts": len(r.parts),
            "read_bytes": r.read_bytes,
            "payload_bytes": r.payload_bytes,
            "requests": r.request_count(parts),
            "copies": r.copy_count,
            "kernels": r.kernel_count,
            "host_peak_bytes": w.host_bytes if w else 0,
            "device_peak_bytes": w.device_bytes if w else 0,
            "landing_bytes": r.landing_bytes,
            "dominant_step": dominant_step(plan, r.index)[0],
        })
    doc = {
        "fits": plan.fits,
        "spec": plan.spec.path,
        "checkpoint": plan.checkpoint.source,
        "device": plan.device,
        "budget": budget._asdict(),
        "peak": peak._asdict(),
        "headroom": {
            "host_bytes": budget.host_bytes - peak.host_bytes,
            "device_bytes": None if budget.device_bytes is None else budget.device_bytes - peak.device_bytes,
        },
        "layout": {**lay._asdict(), "landing_region_bytes": list(lay.landing_region_bytes),
                   "zero": [list(z) for z in lay.zero], "scatter_table_bytes": lay.scatter_table_bytes},
        "io": plan.io._asdict(),
        "verify": {"chunk_bytes": verify_chunk(plan), "host_bytes": verify_host_bytes(plan)},
        "totals": plan.totals._asdict(),
        "paths": _paths(parts),
        "tensor_parallel": plan.tensor_parallel._asdict(),
        "strided_reads": _strided(plan),
        "costs": (plan.costs or DEFAULTS)._asdict(),
        "runs": runs,
        "top_contributors": _top(plan),
        "skipped": len(plan.skipped),
        "tensors": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "bytes": t.nbytes}
                    for t in plan.tensors],
        "refusal": plan.refusal.as_dict() if plan.refusal else None,
        "predicted_time": predict(plan),
        "limits": limits(plan),
        "checks": _checks(plan, node),
        "source": plan.note("source", "plan file"),
        "cache_entry": plan.note("cache_entry") or None,
    }
    if node is not None and not node.fits:
        from .node import node_refusal

        doc["fits"] = False
        if doc["refusal"] is None:
            doc["refusal"] = node_refusal(node).as_dict()
    return doc


def _checks(plan: Plan, node=None) -> dict:
    """What the verdict rests on: each memory, checked against its budget or not (and why not)."""
    b, pk = plan.budget, plan.peak
    dev_how = plan.note("device_budget", "spec" if b.device_bytes is not None else "unset")
    return {
        "host": {"checked": True, "peak_bytes": pk.host_bytes, "budget_bytes": b.host_bytes,
                 "fits": pk.host_bytes <= b.host_bytes},
        "device": {"checked": b.device_bytes is not None, "peak_bytes": pk.device_bytes,
                   "budget_bytes": b.device_bytes,
                   "fits": None if b.device_bytes is None else pk.device_bytes <= b.device_bytes,
                   "budget_from": dev_how},
        "node": None if node is None else {**node.as_dict(), "peak_bytes": node.total_bytes},
    }


def verdict_text(e: dict) -> str:
    """`FITS` / `REFUSED` and what was and was not checked (plain text, no markup)."""
    c = e["checks"]
    said = ["host checked"]
    d = c["device"]
    if d["checked"]:
        said.append("device checked" + (" (budget.device auto)" if d["budget_from"].startswith("auto") else ""))
    else:
        why = "no budget.device" if d["budget_from"] == "unset" else d["budget_from"]
        said.append(f"device NOT CHECKED: peak {fmt_bytes(d['peak_bytes'])}, {why}")
    n = c.get("node")
    if n is not None:
        said.append(f"node {n['node']} (ranks {n['ranks'][0]}..{n['ranks'][-1]}) "
                    + (f"checked: {fmt_bytes(n['total_bytes'])} of {fmt_bytes(n['budget_bytes'])}" if n["checked"] else
                       f"not checked: {fmt_bytes(n['total_bytes'])} together, no budget.node_host"))
    return ("FITS" if e["fits"] else "REFUSED") + " (" + "; ".join(said) + ")"


def limits_text(lim) -> str:
    """The GB/s beside the limits, one line (plain text, no markup): `explain`'s `limits` (predicted
    only) or a load report's (measured, then predicted)."""
    rates = [(lim["host_gb_per_s"], "host", "probe" if lim["host_from"] == "probe" else "default costs"),
             (lim["link_gb_per_s"], "link", "probe" if lim["link_from"] == "probe" else "built in")]
    rates = sorted((r for r in rates if r[0]), key=lambda r: r[0])  # the ceiling first

    def against(gbps):
        if gbps is None or not rates:
            return ""
        return ": " + ", ".join(f"{gbps / rate:.2f} of the {what}'s {rate:.2f} GB/s ({source})"
                                for rate, what, source in rates)

    pred = lim["predicted_gb_per_s"]
    pred_s = "n/a" if pred is None else f"{pred:.2f} GB/s"
    if "measured_gb_per_s" not in lim:
        return f"predicted {pred_s}{against(pred)}"
    meas = lim["measured_gb_per_s"]
    meas_s = "n/a" if meas is None else f"{meas:.2f} GB/s"
    return f"measured {meas_s}{against(meas)}; predicted {pred_s}"


def _strided(plan: Plan) -> list:
    """Tensor-parallel slices of a later dim: how each is read, the predicted seconds of both ways
    (`costmodel`, with the plan's cost figures) and why."""
    out = []
    costs, slot, mode = plan.costs or DEFAULTS, plan.io.slot_bytes, plan.io.strided
    for p in plan.parts:
        if p.path == "host":
            continue
        for i in p.inputs:
            if i.count > 1:
                how, mapped, rows = choose(costs, i.seg, i.stride, i.count, slot, mode)
                if mode != "auto" and i.seg <= slot:
                    why = f"io.strided is {mode}"
                elif i.seg > slot:
                    why = "a segment is longer than a slot"
                else:
                    why = (f"rows predicted {ROWS_MARGIN}x+ faster" if how == "rows" else
                           f"rows not predicted {ROWS_MARGIN}x faster")
                out.append({"tensor": p.tensor, "source": i.tensor, "method": how, "segments": i.count,
                            "segment_bytes": i.seg, "stride_bytes": i.stride, "payload_bytes": i.nbytes,
                            "rows_bytes": (i.count - 1) * i.stride + i.seg,
                            "predicted_seconds": {"mapped": None if mapped == float("inf") else mapped, "rows": rows},
                            "why": why})
    return out


def _paths(parts) -> dict:
    out: dict = {}
    for p in parts:
        key = f"{p.path}: {p.reason}"
        e = out.setdefault(key, {"parts": 0, "bytes": 0})
        e["parts"] += 1
        e["bytes"] += p.out_bytes
    return dict(sorted(out.items()))


def _top(plan: Plan) -> list:
    lay = plan.layout
    items = [{"what": "pinned ring", "memory": "host", "bytes": lay.ring_bytes},
             {"what": "landing regions", "memory": "device", "bytes": lay.landing_bytes},
             {"what": "device staging slots (scatter)", "memory": "device", "bytes": lay.staging_bytes},
             {"what": "scatter table", "memory": "device", "bytes": lay.scatter_table_bytes}]
    for t in plan.tensors:
        items.append({"what": t.name, "memory": "device", "bytes": t.nbytes})
    for p in plan.parts:
        if p.host_bytes:
            items.append({"what": f"host scratch {p.label}", "memory": "host", "bytes": p.host_bytes})
    items.sort(key=lambda x: (-x["bytes"], x["what"]))
    return [i for i in items if i["bytes"]][:TOP]


def render(plan: Plan, console: Console, node=None) -> None:
    e = explain_doc(plan, node)
    b, pk, t = e["budget"], e["peak"], e["totals"]
    v = verdict_text(e)
    rest = v.split(" ", 1)[1]
    verdict = ("[green]FITS[/green] " if e["fits"] else "[red]REFUSED[/red] ") + escape(rest)
    tp = e["tensor_parallel"]
    rank = f" (rank {tp['rank']} of {tp['size']})" if tp["size"] > 1 else ""
    console.print(f"[bold]planc explain[/bold]{rank}  {escape(e['spec'])}  ->  {escape(e['checkpoint'])}  on "
                  f"{escape(e['device'])}: {verdict}")
    if e["source"] == "cache":
        console.print("plan: from the plan cache, " + escape(printable(e["cache_entry"])))
    tb = Table(title="budget", show_edge=False)
    for c in ("", "budget", "predicted peak", "headroom"):
        tb.add_column(c, justify="right" if c else "left")
    tb.add_row("host", fmt_bytes(b["host_bytes"]), fmt_bytes(pk["host_bytes"]), fmt_bytes(e["headroom"]["host_bytes"]))
    tb.add_row("device", fmt_bytes(b["device_bytes"]) if b["device_bytes"] is not None else "not checked",
               fmt_bytes(pk["device_bytes"]), fmt_bytes(e["headroom"]["device_bytes"]))
    console.print(tb)
    lay = e["layout"]
    console.print(f"host = pinned ring {fmt_bytes(lay['ring_bytes'])} ({e['io']['slots']} x {fmt_bytes(e['io']['slot_bytes'])})"
                  f" + the host-path buffers of one part at a time;  device = arena {fmt_bytes(lay['arena_bytes'])}"
                  f" + landing {fmt_bytes(sum(lay['landing_region_bytes']))}"
                  f" + staging {fmt_bytes(lay.get('staging_bytes', 0))}"
                  f" + scatter table {fmt_bytes(lay.get('scatter_table_bytes', 0))}")
    vf = e["verify"]
    console.print(f"--verify (after the load, the ring released) holds at most {fmt_bytes(vf['host_bytes'])} "
                  f"of host memory, reading {fmt_bytes(vf['chunk_bytes'])} at a time")
    console.print(f"{t['tensors']} tensors from {t['source_tensors']} source tensors, {fmt_bytes(t['read_bytes'])} read "
                  f"({fmt_bytes(t['payload_bytes'])} payload) in {t['runs']} runs; requests {t['requests']} "
                  f"(uncoalesced {t['requests_uncoalesced']}), copies {t['copies']} (uncoalesced {t['copies_uncoalesced']}), "
                  f"kernels {t['kernels']}, skipped {e['skipped']}")
    pt = e["predicted_time"]
    console.print(f"predicted wall: {pt['warm_seconds']:.3f} s warm, {pt['cold_seconds']:.3f} s cold (fixed "
                  f"{pt['terms']['fixed_seconds']:.3f} s, reads {pt['terms']['read_warm_seconds']:.3f} s warm, link "
                  f"{pt['terms']['link_seconds']:.3f} s); " + escape(printable(pt["note"])))
    console.print("limits: " + escape(printable(limits_text(e["limits"]))))
    tp = Table(title="paths", show_edge=False)
    for c in ("path and reason", "parts", "bytes"):
        tp.add_column(c, justify="left" if c.startswith("path") else "right")
    for k, v in e["paths"].items():
        tp.add_row(escape(printable(k)), str(v["parts"]), fmt_bytes(v["bytes"]))
    console.print(tp)
    if e["strided_reads"]:
        ts = Table(title="strided reads (tensor-parallel slices of a later dim)", show_edge=False)
        for c in ("read as", "slices", "segments", "payload", "whole rows", "predicted s", "why"):
            ts.add_column(c, justify="left" if c in ("read as", "why") else "right")
        groups: dict = {}
        for x in e["strided_reads"]:
            g = groups.setdefault((x["method"], x["why"]), [0, 0, 0, 0, 0.0])
            g[0] += 1
            g[1] += x["segments"]
            g[2] += x["payload_bytes"]
            g[3] += x["rows_bytes"]
            g[4] += x["predicted_seconds"][x["method"]]
        for (how, why), (n, segs, pay, rows, sec) in sorted(groups.items()):
            ts.add_row(how, str(n), str(segs), fmt_bytes(pay), fmt_bytes(rows), f"{sec:.4f}", escape(printable(why)))
        console.print(ts)
        console.print("cost figures: " + escape(printable(e["costs"]["source"])) + " (planc probe measures them)")
    tr = Table(title="runs", show_edge=False)
    for c in ("run", "tensors", "read", "requests", "copies", "kernels", "host peak", "device peak", "dominant step"):
        tr.add_column(c, justify="left" if c == "dominant step" else "right")
    shown = e["runs"] if len(e["runs"]) <= 24 else e["runs"][:12] + e["runs"][-12:]
    for r in shown:
        tr.add_row(str(r["index"]), str(r["tensors"]), fmt_bytes(r["read_bytes"]), str(r["requests"]), str(r["copies"]),
                   str(r["kernels"]), fmt_bytes(r["host_peak_bytes"]), fmt_bytes(r["device_peak_bytes"]), escape(printable(r["dominant_step"])))
    console.print(tr)
    if len(e["runs"]) > 24:
        console.print(f"({len(e['runs']) - 24} runs not shown; --json lists all)")
    tt = Table(title="top contributors", show_edge=False)
    for c in ("what", "memory", "bytes"):
        tt.add_column(c, justify="right" if c == "bytes" else "left")
    for i in e["top_contributors"]:
        tt.add_row(escape(printable(i["what"])), i["memory"], fmt_bytes(i["bytes"]))
    console.print(tt)
    if e["refusal"]:
        r = e["refusal"]
        where = f"run {r['run']}, step {r['step']}" if r["run"] is not None else "the node"
        console.print("[red]refusal[/red] " + escape(f"[{r['code']}] {where}: {r['message']}"))


def render_nodes(nodes, console: Console) -> None:
    """The node table: each node's ranks, their host peaks together, the budget and the verdict."""
    t = Table(title="nodes: the ranks' host peaks together", show_edge=False)
    for c in ("node", "ranks", "host total", "budget.node_host", "fits", "all at once: predicted wall warm / cold"):
        t.add_column(c, justify="right")
    for n in nodes:
        p = n.predicted
        t.add_row(str(n.node), f"{n.ranks[0]}..{n.ranks[-1]}", fmt_bytes(n.total_bytes),
                  fmt_bytes(n.budget_bytes) if n.budget_bytes is not None else "not checked",
                  ("yes" if n.fits else "REFUSED") if n.budget_bytes is not None else "-",
                  f"{p['warm_seconds']:.2f} s / {p['cold_seconds']:.2f} s" if p else "-")
    console.print(t)
