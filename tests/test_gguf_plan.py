"""GGUF quantized tensors in plans, under the CUDA simulator: a rule's float dtype dequantizes the
blocks of every type planc takes (on the device, or `on: host`) bit-exact to `gguf.quants.dequantize`;
`keep` loads the stored blocks (U8 rows, the GGML type on the part); the plan file holds the op to
its types and sizes (edited plans refused); a tensor-parallel rank reads whole blocks of its slice."""

import os

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import json  # noqa: E402

import gguf  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from execute_support import SMALL_IO, llamacpp_want, load_checked, spec_file  # noqa: E402
from planc.compiler.compile import compile_spec  # noqa: E402
from planc.base.errors import BindError, PlanFormatError  # noqa: E402
from planc.execute import execute  # noqa: E402
from planc.manifest.ggml_types import BY_NAME  # noqa: E402
from planc.plan.codec import decode, encode  # noqa: E402
from planc.tools.synth_gguf import GGUFTensor, tensor_bytes  # noqa: E402

TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")
NP = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32, "float16": np.float16}
SHAPE = (4, 512)  # 4 rows of 2 (K-quants) or 16 blocks


def _write(path, tensors) -> dict:
    """A GGUF of `tensors` [(name, type, shape)] written by the gguf package; {name: stored bytes}."""
    specs = [GGUFTensor(n, q, s) for n, q, s in tensors]
    w = gguf.GGUFWriter(str(path), "llama")
    for t in specs:
        row = t.shape[-1] // BY_NAME[t.type].block * BY_NAME[t.type].block_bytes  # the writer takes byte shapes
        w.add_tensor_info(t.name, (*t.shape[:-1], row), np.dtype(np.uint8), t.nbytes,
                          raw_dtype=gguf.GGMLQuantizationType[t.type])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    raw = {t.name: tensor_bytes(t, 7) if t.type in TYPES else np.arange(t.nbytes, dtype=np.uint8) for t in specs}
    for t in specs:
        w.write_tensor_data(raw[t.name])
    w.close()
    return raw


def _ref(raw, qtype, shape, dtype):
    rows = int(np.prod(shape[:-1]))
    out = gguf.quants.dequantize(raw.reshape(rows, -1), gguf.GGMLQuantizationType[qtype]).astype(NP[dtype])
    return out.reshape(shape)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    raw = _write(d / "m.gguf", [(f"{w}.{q}", q, SHAPE) for q in TYPES for w in ("t", "k")])
    return d, d / "m.gguf", raw


@pytest.mark.parametrize("on", ["device", "host"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_every_type_dequantized_and_kept_bit_exact(ckpt, on, dtype):
    d, path, raw = ckpt
    spec = spec_file(d, path, [{"match": "k.*", "dtype": "keep"}, {"match": "t.*", "dtype": dtype, "on": on}],
                     io=SMALL_IO, name=f"s-{on}-{dtype}.yaml")
    models = []
    plan, model = load_checked(spec, models)  # with --verify against the host reference
    for q in TYPES:
        got = model[f"t.{q}"].to_host()
        want = _ref(raw[f"t.{q}"], q, SHAPE, dtype)
        assert got.dtype == want.dtype and got.shape == SHAPE and got.tobytes() == want.tobytes(), q
        kept = model[f"k.{q}"].to_host()
        assert kept.dtype == np.uint8 and kept.shape == (4, 512 // BY_NAME[q].block * BY_NAME[q].block_bytes)
        assert kept.tobytes() == raw[f"k.{q}"].tobytes(), q
    parts = {p.tensor: p for p in plan.parts}
    assert all(parts[f"t.{q}"].op == "gguf" and parts[f"t.{q}"].ggml == q for q in TYPES)
    assert all(parts[f"k.{q}"].op == "copy" and parts[f"k.{q}"].ggml == q for q in TYPES)
    assert {parts[f"t.{q}"].path for q in TYPES} == {"host" if on == "host" else "direct"}
    if on == "device":  # the blocks land on the device, counted in the plan's peak
        assert all(parts[f"t.{q}"].landing_bytes == raw[f"t.{q}"].size for q in TYPES)
        assert plan.peak.device_bytes >= plan.layout.arena_bytes + max(raw[f"t.{q}"].size for q in TYPES)
    del models


def _doc(plan) -> dict:
    return json.loads(encode(plan))


def _part(doc, tensor: str) -> list:
    ti = [t[0] for t in doc["tensors"]].index(tensor)
    return next(p for p in doc["parts"] if p[0] == ti)


def test_the_plan_file_round_trips_and_edits_are_refused(ckpt):
    d, path, raw = ckpt
    spec = spec_file(d, path, [{"match": "k.*", "dtype": "keep"}, {"match": "t.*", "dtype": "bfloat16"}],
                     io=SMALL_IO, name="s-edit.yaml")
    plan = compile_spec(spec)
    assert decode(encode(plan)).parts == plan.parts
    ggml = 13  # the part record's field order
    edits = {
        "a type of another block size": lambda doc: _part(doc, "t.Q4_K").__setitem__(ggml, "Q8_0"),
        "no type": lambda doc: _part(doc, "t.Q6_K").__setitem__(ggml, ""),
        "an unknown type": lambda doc: _part(doc, "t.Q6_K").__setitem__(ggml, "Q9_9"),
        "kept blocks made F16": lambda doc: _part(doc, "k.Q8_0").__setitem__(8, "F16"),
        "more output bytes": lambda doc: _part(doc, "t.Q8_0").__setitem__(7, _part(doc, "t.Q8_0")[7] + 2),
        "fewer block bytes": lambda doc: _part(doc, "t.Q4_0")[5][0].__setitem__(4, _part(doc, "t.Q4_0")[5][0][4] - 18),
        "a kernel's values": lambda doc: next(k for r in doc["runs"] for k in r[2] if k[1] == "gguf").__setitem__(
            8, 1 << 20),
    }
    for what, edit in edits.items():
        doc = _doc(plan)
        edit(doc)
        with pytest.raises(PlanFormatError, match=r"parts\[|kernels\[") as e:
            decode(json.dumps(doc))
        assert e.value.code, what


def test_a_type_swapped_for_one_that_fits_the_same_bytes_is_refused_against_the_headers(ckpt):
    """Q4_K rows of 288 bytes are also 16 Q4_0 blocks of 512 values: a plan so edited is consistent in
    itself, and the load refuses it against the file's header before it allocates anything."""
    d, path, raw = ckpt
    plan = compile_spec(spec_file(d, path, [{"match": "t.*", "dtype": "float32"}, {"match": "k.*", "skip": True}],
                                  io=SMALL_IO, name="s-swap.yaml"))
    doc = _doc(plan)
    _part(doc, "t.Q4_K")[13] = "Q4_0"
    edited = decode(json.dumps(doc))
    with pytest.raises(PlanFormatError) as e:
        execute(edited)
    assert e.value.code == "plan-header-mismatch" and "Q4_K" in str(e.value)


@pytest.mark.parametrize("dim", [0, 1])
def test_a_tensor_parallel_rank_reads_its_rows_of_blocks(ckpt, dim):
    d, path, raw = ckpt
    spec = spec_file(d, path, [{"match": "t.*", "dtype": "float32", "split": {"dim": dim}},
                               {"match": "k.*", "skip": True}], io=SMALL_IO, name=f"s-tp{dim}.yaml")
    doc = __import__("yaml").safe_load(spec.read_text())
    doc["tensor_parallel"] = {"size": 2}
    spec.write_text(__import__("yaml").safe_dump(doc))
    for rank in range(2):
        plan = compile_spec(spec, rank)
        model = execute(plan, verify=True)
        assert model.report["verify"]["ok"]
        for q in TYPES:
            whole = _ref(raw[f"t.{q}"], q, SHAPE, "float32")
            want = whole[rank * 2:(rank + 1) * 2] if dim == 0 else whole[:, rank * 256:(rank + 1) * 256]
            assert model[f"t.{q}"].to_host().tobytes() == np.ascontiguousarray(want).tobytes(), (q, rank)
        del model


def test_refusals_name_the_rule_and_tensor(tmp_path):
    _write(tmp_path / "m.gguf", [("t", "Q4_K", (2, 512)), ("u", "IQ2_XXS", (2, 256))])
    cases = [
        ([{"match": "t", "dtype": "float32", "transpose": True}, {"match": "u", "dtype": "keep"}], "bad-transpose"),
        ([{"match": "t", "dtype": "keep"}, {"match": "u", "dtype": "float32"}], "gguf-dequantize"),
    ]
    for k, (rules, code) in enumerate(cases):
        with pytest.raises(BindError) as e:
            compile_spec(spec_file(tmp_path, tmp_path / "m.gguf", rules, name=f"r{k}.yaml"))
        assert e.value.code == code and ("rules[0]" in str(e.value) or "rules[1]" in str(e.value))
    spec = spec_file(tmp_path, tmp_path / "m.gguf", [{"match": "*", "dtype": "keep", "split": {"dim": 1}}],
                     name="r-tp.yaml")
    doc = __import__("yaml").safe_load(spec.read_text())
    doc["tensor_parallel"] = {"size": 2}
    spec.write_text(__import__("yaml").safe_dump(doc))
    with pytest.raises(BindError) as e:
        compile_spec(spec)
    assert e.value.code == "split-gguf-block"


def _shipped_gguf_spec(tmp_path, checkpoint, dtype=None):
    import yaml

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    doc = yaml.safe_load(open(os.path.join(root, "specs", "transformers-llama-gguf.yaml")).read())
    doc["checkpoint"], doc["io"], doc["budget"] = str(checkpoint), SMALL_IO, {"host": "64MiB"}
    if dtype:
        for r in doc["rules"]:
            if "dtype" in r:
                r["dtype"] = dtype
    path = tmp_path / "llama-gguf.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


# on the host: the simulator runs a kernel's threads as Python threads, and these tensors have 10**5 values
@pytest.mark.parametrize("quant,on", [("Q4_K_M", "host"), ("Q8_0", "host"), ("F16", "host")])
def test_shipped_llama_spec_renames_dequantizes_and_unpermutes(tmp_path, quant, on):
    """specs/transformers-llama-gguf.yaml on a Llama GGUF: every tensor under transformers' name (the
    `gguf` package's own map, through planc.manifest.gguf_names), q and k rows in transformers' order
    (`unpermute_rows` of the dequantized tensor), bit for bit, verified."""
    from execute_support import gguf_llama_want
    from planc.tools.synth_gguf import write_gguf

    res = write_gguf(tmp_path / "ck", quant=quant, layers=1)
    spec = _shipped_gguf_spec(tmp_path, res.path, "float32")
    if on == "host":
        import yaml

        doc = yaml.safe_load(spec.read_text())
        for r in doc["rules"]:
            r.setdefault("on", "host") if "dtype" in r else None
        spec.write_text(yaml.safe_dump(doc))
    models = []
    plan, model = load_checked(spec, models)
    want = gguf_llama_want(res.path)
    assert set(model.keys()) == set(want)
    for name, (gguf_name, values) in want.items():
        assert model[name].to_host().tobytes() == values.tobytes(), gguf_name
    del models


@pytest.mark.parametrize("dtype", ["float32", "keep"])
def test_unpermute_on_the_device_of_a_small_llama_file(tmp_path, dtype):
    """q (2 heads) and k (1 head) of head dim 4, Q8_0, rows in transformers' order: dequantized, each
    tensor one part read whole whose kernel writes the rows in that order (`unpermute`: 4); kept, each
    head and half one strided read."""
    from planc.manifest.gguf_names import unpermute_rows

    path = tmp_path / "m.gguf"
    specs = [GGUFTensor("blk.0.attn_q.weight", "Q8_0", (8, 64)), GGUFTensor("blk.0.attn_k.weight", "Q8_0", (4, 64))]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_head_count(2)
    w.add_head_count_kv(1)
    for t in specs:
        w.add_tensor_info(t.name, (t.shape[0], 68), np.dtype(np.uint8), t.nbytes, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    raw = {t.name: tensor_bytes(t, 3) for t in specs}
    for t in specs:
        w.write_tensor_data(raw[t.name])
    w.close()
    spec = spec_file(tmp_path, path, [{"match": "*", "dtype": dtype, "unpermute": True}], io=SMALL_IO)
    models = []
    plan, model = load_checked(spec, models)
    if dtype == "keep":
        assert len(plan.parts) == 2 * 2 + 2 * 1 and all(p.inputs[0].count == 2 for p in plan.parts)
        assert {p.unpermute for p in plan.parts} == {0}
    else:
        assert len(plan.parts) == 2 and all(p.inputs[0].count == 1 and p.unpermute == 4 for p in plan.parts)
        assert all("transformers' row order" in p.reason for p in plan.parts)
    # the halves of each head tile their rows: read as plain requests, each byte once, no mapping
    reqs = [q for r in plan.runs for q in r.requests]
    assert all(q.count == 1 and q.stride == 0 for q in reqs)
    assert sum(c.moved for q in reqs for c in q.copies) == sum(p.read_bytes for p in plan.parts)
    if dtype != "keep":  # q's and k's blocks and values lie end to end, both of heads of 4: one launch, one copy
        kernels = [k for r in plan.runs for k in r.kernels]
        assert len(kernels) == 1 and sorted(q for k in kernels for q in k.parts) == [p.id for p in plan.parts]
        assert kernels[0].unpermute == 4
        assert sum(len(q.copies) for q in reqs) == len(reqs) and all(c.rows == 1 for q in reqs for c in q.copies)
    for t, heads in zip(specs, (2, 1)):
        if dtype == "keep":
            want = unpermute_rows(raw[t.name].reshape(t.shape[0], 68), heads)
        else:
            want = unpermute_rows(_ref(raw[t.name], "Q8_0", t.shape, "float32"), heads)
        assert model[t.name].to_host().tobytes() == np.ascontiguousarray(want).tobytes(), t.name
    del models


def _unpermute_plan(tmp_path, on="device"):
    """A plan of a one-layer Q8_0 Llama whose q / k rules unpermute and dequantize (and one that does not)."""
    from planc.tools.synth_gguf import write_gguf

    res = write_gguf(tmp_path / "ck", quant="Q8_0", layers=1)
    rules = [{"match": f"blk.0.attn_{x}.weight", "unpermute": True, "dtype": "bfloat16", "on": on} for x in "qk"]
    spec = spec_file(tmp_path, res.path, [*rules, {"match": "blk.0.attn_v.weight", "dtype": "bfloat16", "on": on},
                                          {"match": "*", "skip": True}], io=SMALL_IO)
    return json.loads(encode(compile_spec(spec)))


def test_an_unpermuted_gguf_tensor_is_one_part_one_plain_read_and_its_kernel_says_so(tmp_path):
    doc = _unpermute_plan(tmp_path)
    f = doc["fields"]["part"].index("unpermute")
    parts = {doc["tensors"][p[0]][0]: p for p in doc["parts"]}
    heads = {"blk.0.attn_q.weight": None, "blk.0.attn_k.weight": None}
    for name in heads:
        p = parts[name]
        rows = p[5][0][6][0]
        assert p[f] > 0 and rows % p[f] == 0 and p[5][0][9] == 1  # one input, read whole
    assert parts["blk.0.attn_v.weight"][f] == 0
    k = doc["fields"]["kernel"].index("unpermute")
    got = sorted(x[k] for r in doc["runs"] for x in r[2])
    assert got.count(0) >= 1 and set(got) - {0} == {parts["blk.0.attn_q.weight"][f]}


@pytest.mark.parametrize("edit,field", [
    (lambda p, k, v: p.__setitem__(15, 3), r"parts\[\d+\]\.unpermute: is 3"),  # odd
    (lambda p, k, v: p.__setitem__(15, -2), r"parts\[\d+\]\.unpermute"),
    (lambda p, k, v: p.__setitem__(15, "2"), r"parts\[\d+\]\.unpermute"),
    (lambda p, k, v: p.__setitem__(15, 1 << 20), r"parts\[\d+\]\.unpermute"),
    (lambda p, k, v: v.__setitem__(15, 2), r"kernels\[\d+\]\.unpermute: is 0, but part \d+'s is 2"),  # v: as stored
    (lambda p, k, v: k.__setitem__(15, 0), r"kernels\[\d+\]\.unpermute: is 0, but part \d+'s is"),  # no longer unpermutes
])
def test_a_plan_whose_unpermute_was_edited_is_refused(tmp_path, edit, field):
    doc = _unpermute_plan(tmp_path)
    part = next(p for p in doc["parts"] if p[15])
    rows = part[5][0][6][0]
    other = next(p for p in doc["parts"] if not p[15] and p[5][0][6][0] % 2 == 0 and p[5][0][6][0] != rows)
    kernel = next(k for r in doc["runs"] for k in r[2] if k[15])
    edit(part, kernel, other)
    if field.endswith("is 3") and rows % 3 == 0:
        pytest.skip("3 divides the rows")
    with pytest.raises(PlanFormatError, match=field):
        decode(json.dumps(doc))


@pytest.mark.parametrize("who,value", [("q", 2), ("q", 256), ("v", 64)])
def test_a_consistent_but_false_unpermute_is_refused_against_the_files_header(tmp_path, who, value):
    """A plan edited so that a part and its kernel agree on heads the file does not have passes the
    plan's own checks; the load holds it to the GGUF header's head counts first ([plan-header-mismatch]).
    (A q or k read as stored, unpermute 0, is what a spec without `unpermute` asks for.)"""
    from planc.base.errors import PlanFormatError as PFE

    doc = _unpermute_plan(tmp_path)
    names = [t[0] for t in doc["tensors"]]
    part = next(p for p in doc["parts"] if names[p[0]] == f"blk.0.attn_{who}.weight")
    pid = doc["parts"].index(part)
    part[15] = value
    for r in doc["runs"]:
        for k in r[2]:
            if k[0] == pid or pid in k[12]:
                k[15] = value
                for q in k[12] + [k[0]]:  # the parts sharing its launch follow it
                    doc["parts"][q][15] = value
    try:
        plan = decode(json.dumps(doc))
    except PFE:
        pytest.skip("refused by the plan's own checks")
    with pytest.raises(PFE, match=r"unpermuting heads of \d+ rows, but the file's header gives") as e:
        execute(plan)
    assert e.value.code == "plan-header-mismatch"


def test_a_plan_whose_convert_unpermutes_is_refused(tmp_path):
    from planc.tools.synth_gguf import write_gguf

    res = write_gguf(tmp_path / "ck", quant="Q8_0", layers=1)
    spec = spec_file(tmp_path, res.path, [{"match": "blk.0.attn_norm.weight", "dtype": "bfloat16"},
                                          {"match": "*", "skip": True}], io=SMALL_IO)
    doc = json.loads(encode(compile_spec(spec)))
    conv = next(p for p in doc["parts"] if p[2] == "convert")
    conv[15] = 2
    with pytest.raises(PlanFormatError, match=r"unpermute: only a gguf dequantization"):
        decode(json.dumps(doc))
    conv[15] = 0
    k = next(x for r in doc["runs"] for x in r[2])
    k[15] = 2
    with pytest.raises(PlanFormatError, match=r"kernels\[0\]\.unpermute: only a gguf dequantization"):
        decode(json.dumps(doc))


def test_unpermute_on_the_host_is_the_device_load(tmp_path):
    """The same rules on the host path and the device path: the same bytes, each verified."""
    got = {}
    for on in ("device", "host"):
        doc = _unpermute_plan(tmp_path / on, on)
        assert all(p[3] == ("host" if on == "host" else "direct") for p in doc["parts"])
        models = []
        plan = decode(json.dumps(doc))
        model = execute(plan, verify=True)
        models.append(model)
        assert model.report["verify"]["ok"]
        got[on] = {n: model[n].to_host().tobytes() for n in ("blk.0.attn_q.weight", "blk.0.attn_k.weight")}
        for m in models:
            m.free()
    assert got["device"] == got["host"]


def test_unpermute_refusals(tmp_path):
    from planc.tools.synth_gguf import write_gguf

    res = write_gguf(tmp_path / "ck", quant="Q8_0", layers=1)
    for k, rule in enumerate([{"match": "blk.0.attn_v.weight", "unpermute": True, "dtype": "float32"},
                              {"match": "blk.0.attn_q.weight", "unpermute": True, "transpose": True}]):
        spec = spec_file(tmp_path, res.path, [rule, {"match": "*", "skip": True}], name=f"u{k}.yaml")
        with pytest.raises(BindError) as e:
            compile_spec(spec)
        assert e.value.code in ("bad-unpermute", "bad-transpose") and "rules[0]" in str(e.value)


def test_verify_finds_a_changed_value_of_a_dequantized_tensor(ckpt):
    """`--verify` dequantizes the file's blocks again (whole rows of blocks): one flipped bit in the
    arena, in the last row of a tensor, is a mismatch naming its part."""
    from planc.execute.pipeline.verify import verify_model

    d, path, raw = ckpt
    plan = compile_spec(spec_file(d, path, [{"match": "t.*", "dtype": "bfloat16"}, {"match": "k.*", "skip": True}],
                                  io=SMALL_IO, name="s-flip.yaml"))
    model = execute(plan)
    try:
        assert verify_model(plan, model)["ok"]
        p = next(p for p in plan.parts if p.tensor == "t.Q6_K")
        at = p.dst_offset + p.out_bytes - 1
        byte = model._arena[at:at + 1].copy_to_host()
        model._arena[at:at + 1].copy_to_device(byte ^ np.uint8(1))
        got = verify_model(plan, model)
        assert not got["ok"] and got["mismatches"] == [f"{p.label} (t.Q6_K)"]
    finally:
        model.free()


def test_the_plans_gguf_kernels_are_warmed_on_a_whole_block(ckpt):
    """Before the first read, the warming thread launches each GGUF kernel the plan needs once, on
    one whole block of its type (a device that loads modules loads them there, not on the stream)."""
    from execute_support import RecordingDevice
    from planc.execute.device import seam
    from planc.execute.pipeline.kernelruns import warm_kernels

    class Loading(RecordingDevice):
        loads_kernels = True

    d, path, _ = ckpt
    plan = compile_spec(spec_file(d, path, [{"match": "t.*", "dtype": "bfloat16"}, {"match": "*", "skip": True}],
                                  io=SMALL_IO, name="warm.yaml"))
    dev = Loading(seam.device())
    warm_kernels(plan, dev).join()
    block = {q: BY_NAME[q].block for q in TYPES}
    got = {name: args[2] for name, _, _, args in dev.launches}  # (src, dst, numel, row, hd)
    assert got == {f"gguf_{q}_BF16": block[q] for q in TYPES}


def _qk_file(path, q_heads, kv_heads, hd, cols=64):
    """A GGUF of blk.0.attn_q / attn_k (Q8_0, rows in llama.cpp's order) with their head counts; raw bytes."""
    specs = [GGUFTensor("blk.0.attn_q.weight", "Q8_0", (q_heads * hd, cols)),
             GGUFTensor("blk.0.attn_k.weight", "Q8_0", (kv_heads * hd, cols))]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_head_count(q_heads)
    w.add_head_count_kv(kv_heads)
    for t in specs:
        w.add_tensor_info(t.name, (t.shape[0], cols // 32 * 34), np.dtype(np.uint8), t.nbytes,
                          raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    raw = {t.name: tensor_bytes(t, 5) for t in specs}
    for t in specs:
        w.write_tensor_data(raw[t.name])
    w.close()
    return specs, raw


def _tp(spec, world):
    import yaml

    doc = yaml.safe_load(spec.read_text())
    doc["tensor_parallel"] = {"size": world}
    spec.write_text(yaml.safe_dump(doc))
    return spec


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dtype", ["float32", "keep"])
def test_a_rank_of_unpermuted_q_k_is_its_heads_of_the_whole_unpermuted_tensor(tmp_path, world, dtype):
    """A row split of q (4 heads) and k (4 kv heads) that llama.cpp permuted: each rank's tensor is its
    slice of the whole tensor in transformers' order (a rank's whole heads: the same row range in both
    orders), dequantized on the device or kept, verified."""
    from planc.manifest.gguf_names import unpermute_rows

    specs, raw = _qk_file(tmp_path / "m.gguf", 4, 4, 4)
    spec = _tp(spec_file(tmp_path, tmp_path / "m.gguf", [{"match": "*", "dtype": dtype, "unpermute": True,
                                                           "split": {"dim": 0}}], io=SMALL_IO), world)
    for rank in range(world):
        plan = compile_spec(spec, rank)
        model = execute(plan, verify=True)
        try:
            assert model.report["verify"]["ok"]
            for t in specs:
                whole = (raw[t.name].reshape(t.shape[0], -1) if dtype == "keep"
                         else _ref(raw[t.name], "Q8_0", t.shape, "float32"))
                whole = unpermute_rows(whole, 4)
                per = t.shape[0] // world
                want = np.ascontiguousarray(whole[rank * per:(rank + 1) * per])
                got = model[t.name]
                assert tuple(got.shape) == want.shape and got.to_host().tobytes() == want.tobytes(), (t.name, rank)
        finally:
            model.free()


def test_a_split_of_unpermuted_q_k_off_head_boundaries_is_refused(tmp_path):
    """q of 4 heads and k of 2 kv heads over 4 ranks: k's rank boundaries would fall inside its heads
    (split-unpermute, naming the sizes that fit); a split of the columns is refused the same way."""
    _qk_file(tmp_path / "m.gguf", 4, 2, 8)
    rule = {"match": "*", "dtype": "float32", "unpermute": True, "split": {"dim": 0}}
    spec = _tp(spec_file(tmp_path, tmp_path / "m.gguf", [rule], io=SMALL_IO, name="h.yaml"), 4)
    with pytest.raises(BindError) as e:
        compile_spec(spec, 1)
    assert e.value.code == "split-unpermute" and "blk.0.attn_k.weight" in str(e.value) and "1, 2" in str(e.value)
    spec = _tp(spec_file(tmp_path, tmp_path / "m.gguf", [{**rule, "split": {"dim": 1}}], io=SMALL_IO,
                         name="c.yaml"), 2)
    with pytest.raises(BindError) as e:
        compile_spec(spec, 0)
    assert e.value.code == "split-unpermute" and "dim 0 only" in str(e.value)
    compile_spec(_tp(spec_file(tmp_path, tmp_path / "m.gguf", [rule], io=SMALL_IO, name="ok.yaml"), 2), 1)


def test_a_merged_gguf_kernel_is_checked_part_by_part(tmp_path):
    """A GGUF kernel over several parts (the head halves of unpermuted q / k): its rows, values and
    parts are checked against each part; an edit to any is refused."""
    path = tmp_path / "m.gguf"
    _qk_file(path, 4, 2, 8)
    spec = spec_file(tmp_path, path, [{"match": "*", "dtype": "bfloat16", "unpermute": True}], io=SMALL_IO)
    plan = compile_spec(spec)
    doc = _doc(plan)
    merged = [k for r in doc["runs"] for k in r[2] if k[1] == "gguf" and k[12]]
    assert merged
    edits = {
        "rows": lambda k: k.__setitem__(9, k[9] - 1),
        "values": lambda k: k.__setitem__(8, k[8] + 32),
        "a part dropped": lambda k: k.__setitem__(12, k[12][:-1]),
        "a part twice": lambda k: k.__setitem__(12, [*k[12], k[12][0]]),
        "the first part again": lambda k: k.__setitem__(12, [k[0], *k[12][1:]]),
    }
    for what, edit in edits.items():
        doc = _doc(plan)
        edit(next(k for r in doc["runs"] for k in r[2] if k[1] == "gguf" and k[12]))
        with pytest.raises(PlanFormatError, match=r"kernels\[") as e:
            decode(json.dumps(doc))
        assert e.value.code, what


@pytest.mark.parametrize("strided", ["auto", "mapped"])
def test_unpermuted_heads_across_slots_pass_the_plan_checks(tmp_path, strided):
    """Heads of 64 rows across 16 KiB slots: a request begins inside a head, where the two halves'
    rows interleave; the plan checker finds each copy's half by the segment that holds it (a plan
    file and a spec loaded through `planc.load`, both checked), and the values are transformers'."""
    import planc
    from planc.manifest.gguf_names import unpermute_rows

    path = tmp_path / "m.gguf"
    specs, raw = _qk_file(path, 4, 2, 64, 256)
    spec = spec_file(tmp_path, path, [{"match": "*", "dtype": "float32", "unpermute": True}],
                     io=dict(SMALL_IO, strided=strided))
    plan = compile_spec(spec)
    assert any(q.offset % (64 * 272) for r in plan.runs for q in r.requests)  # a request starts inside a head
    (tmp_path / "p.json").write_text(encode(plan))
    for target in (spec, str(tmp_path / "p.json")):
        model = planc.load(target)
        try:
            for t, heads in zip(specs, (4, 2)):
                want = unpermute_rows(_ref(raw[t.name], "Q8_0", t.shape, "float32"), heads)
                assert model[t.name].to_host().tobytes() == np.ascontiguousarray(want).tobytes(), t.name
        finally:
            model.free()


LLAMACPP_Q4_K_M = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "llamacpp-Q4_K_M.gguf")


def test_a_llamacpp_q4_k_m_file_with_its_fallbacks_loads_as_float32(tmp_path):
    """A Q4_K_M file made by llama.cpp's own `llama-quantize` (4 layers of hidden 320 from an F32
    Llama written as its converter writes one): rows of 320 are not whole K-quant blocks, so llama.cpp
    stored them as Q5_0 (for Q4_K) and Q8_0 (for Q6_K) beside the Q4_K and Q6_K of the 256-wide rows.
    With `dtype: float32` on every tensor (dequantized on the host here: the simulated kernels would
    take a minute over its 1.5 M values), each value bit for bit as `gguf.quants.dequantize` makes it."""
    from planc.manifest import read_manifest

    types = {t.dtype for t in read_manifest(LLAMACPP_Q4_K_M).tensors}
    assert types == {"F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"}
    spec = spec_file(tmp_path, LLAMACPP_Q4_K_M, [{"match": "*", "dtype": "float32", "on": "host"}],
                     io={"workers": 4, "slot": "1MiB", "slots": 4, "run": "4MiB"}, name="lc.yaml")
    models = []
    plan, model = load_checked(spec, models)
    want = llamacpp_want(LLAMACPP_Q4_K_M)
    assert sorted(model.keys()) == sorted(want)
    for name, w in want.items():
        got = model[name].to_host()
        assert got.shape == w.shape and got.tobytes() == w.tobytes(), name
    del models


def test_synth_falls_back_as_llamacpp_does_on_narrow_rows(tmp_path):
    """synth's Q4_K_M on rows of 320 picks the types llama.cpp's quantizer picked for the file above."""
    from planc.manifest import read_manifest
    from planc.tools.synth_gguf import GGUFDims, write_gguf

    res = write_gguf(tmp_path, quant="Q4_K_M", dims=GGUFDims(320, 5, 1, 256, 128), layers=4)
    got = {t.name: t.dtype for t in read_manifest(res.path).tensors}
    real = {t.name: t.dtype for t in read_manifest(LLAMACPP_Q4_K_M).tensors}
    assert {n: t for n, t in got.items() if n in real} == real


@pytest.mark.parametrize("fmt", ["gguf", "float", "mxfp4"])
def test_a_gguf_kernel_of_a_part_outside_its_run_is_refused_by_name(tmp_path, fmt):
    """A kernel record naming a part that is not its run's, whatever format it claims: the reader's
    error names the field (the formats' own checks never see a part they cannot find)."""
    import json

    from planc.base.errors import PlanFormatError
    from planc.plan.codec import load_plan, save_plan
    from planc.tools.synth_gguf import write_gguf

    res = write_gguf(tmp_path / "ck", quant="Q8_0", layers=1)
    plan = compile_spec(_shipped_gguf_spec(tmp_path, res.path, "float32"))
    path = tmp_path / "p.plan.json"
    save_plan(plan, path)
    doc = json.loads(path.read_text())
    fields, ki = doc["fields"]["kernel"], doc["fields"]["run"].index("kernels")
    k = next(r for r in doc["runs"] if r[ki])[ki][0]  # a run's first kernel
    k[fields.index("part")], k[fields.index("format")] = 10**6, fmt
    path.write_text(json.dumps(doc))
    with pytest.raises(PlanFormatError, match=r"kernels\[0\]\.(part|format)"):
        load_plan(path)
