"""The measured report's JSON is the documented `planc run --json` contract (docs/cli.md, "run --json
report"): every field the docs name is in the report with its type, and the report has no field the
docs do not name. The report is typed and immutable: built once, never edited."""

import os

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import dataclasses  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from execute_support import SMALL_IO, spec_file, synth  # noqa: E402
from planc.compiler.compile import compile_spec  # noqa: E402
from planc.execute import execute  # noqa: E402
from planc.execute.pipeline.records import Count, DeviceMemory, HostMemory, Limits, Report  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

# field -> the JSON types it may take (None: null)
TYPES = {"simulator": bool, "device": str, "tensor_parallel": dict, "wall_seconds": float,
         "gb_per_s": (float, type(None)), "payload_bytes": int, "bytes_read": dict, "requests": dict,
         "copies": dict, "kernels": dict, "run_waits": int, "timings": dict, "kernel_code": dict,
         "files": dict, "retries": int, "verify": dict, "digest": dict, "limits": dict}


def documented() -> list[str]:
    text = (ROOT / "docs" / "cli.md").read_text()
    section = text.split("### run --json report", 1)[1].split("```", 1)[0]
    return re.findall(r"^\| `([a-z_.]+)` \|", section, flags=re.M)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("schema")
    path, _ = synth(tmp, "dense", layers=1)
    plan = compile_spec(spec_file(tmp, path, [{"match": "*.mlp.*", "dtype": "float32"}, {"match": "*"}],
                                  io=SMALL_IO))
    from planc.manifest import digest

    d = tmp / "digest.json"  # a digest-verified load: the report's `digest` too
    d.write_bytes(digest.encode(digest.make_digest(path, extent_bytes=64 << 10)))
    model = execute(plan, verify=True, digest=d)
    yield plan, model.report, model
    model.free()


def test_the_report_json_is_the_documented_contract(report):
    plan, rep, _ = report
    doc = json.loads(json.dumps(rep.as_json()))
    names = documented()
    assert names, "docs/cli.md lost its report table"
    flat = set()
    for k, v in doc.items():
        if k in ("host", "device_memory", "limits"):
            flat |= {f"{k}.{sub}" for sub in v}
        else:
            flat.add(k)
    assert flat == set(names), (sorted(flat - set(names)), sorted(set(names) - flat))
    for k, t in TYPES.items():
        assert isinstance(doc[k], t), (k, doc[k])
    for k in ("requests", "copies", "kernels"):
        assert set(doc[k]) == {"predicted", "issued"} and all(isinstance(x, int) for x in doc[k].values())
    assert set(doc["bytes_read"]) == {"predicted", "measured"}
    assert set(doc["tensor_parallel"]) == {"rank", "size"}
    assert set(doc["verify"]) == {"ok", "tensors", "parts", "bytes", "mismatches", "chunk_bytes", "predicted_host_bytes"}
    assert set(doc["digest"]) == {"ok", "kind", "digest_file", "extent_bytes", "leaf_bytes", "extents", "hashed_bytes",
                                  "hasher", "simd", "loop_bytes", "fill_bytes", "verify_seconds"}
    for f in dataclasses.fields(HostMemory):
        assert f"host.{f.name}" in names
    for f in dataclasses.fields(DeviceMemory):
        assert f"device_memory.{f.name}" in names
    for f in dataclasses.fields(Limits):
        assert f"limits.{f.name}" in names
    lim = doc["limits"]
    assert lim["measured_gb_per_s"] == doc["gb_per_s"] and lim["host_from"] == "default"
    assert lim["measured_over_ceiling"] == pytest.approx(lim["measured_gb_per_s"] / lim["ceiling_gb_per_s"])
    assert all(isinstance(v, (int, float)) for v in doc["timings"].values())


def test_the_report_is_typed_and_immutable(report):
    plan, rep, _ = report
    assert isinstance(rep, Report) and isinstance(rep.copies, Count) and isinstance(rep.host, HostMemory)
    assert isinstance(rep.limits, Limits) and rep["limits"]["ceiling"] == rep.limits.ceiling
    assert rep.copies == Count(plan.totals.copies, rep.copies.issued) and rep["copies"] is rep.copies
    assert rep.host.predicted_peak_bytes == plan.peak.host_bytes == rep["host"]["predicted_peak_bytes"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        rep.wall_seconds = 0.0
    with pytest.raises(TypeError):
        rep["timings"]["plan"] = 1.0
    with pytest.raises(TypeError):
        rep["verify"]["ok"] = False
    later = rep.with_timings(assign=0.5)
    assert later.timings["assign"] == 0.5 and "assign" not in rep.timings  # a new report, the old one unchanged
    no_verify = dataclasses.replace(rep, verify=None)
    assert "verify" not in no_verify and "verify" not in no_verify.as_json()


def test_the_loaded_model_says_it_is_simulated(report):
    _, rep, model = report
    assert model.simulated is True and rep.simulator is True
