"""Golden AAAK files: every later version must read them and write them back byte-identically.

See tests/golden/make_small_aaak.py for how small.aaak and small_result.aaak were made;
zettel_v1.aaak and zettel_v2.aaak are hand-written in zettel-compress's v1 and v2 shapes.
"""
from __future__ import annotations

import importlib.util
import io
import pathlib

from engramdb.aaak import ArchiveRow, DumpHeader, ProcedureRow, decode, encode, read_dump, verify_dump, write_dump
from engramdb.records import Edge, Node

GOLDEN = pathlib.Path(__file__).parent / "golden"


def _generator():
    spec = importlib.util.spec_from_file_location("make_small_aaak", GOLDEN / "make_small_aaak.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_small_dump_restores_and_redumps_byte_identically():
    data = (GOLDEN / "small.aaak").read_bytes()
    items = list(read_dump(io.BytesIO(data)))
    header = items[0]
    assert isinstance(header, DumpHeader) and header.version == 3
    nodes = [x for x in items if isinstance(x, Node)]
    edges = [x for x in items if isinstance(x, Edge)]
    out = io.BytesIO()
    write_dump(out, settings=header.settings, meta=header.meta, spaces=header.spaces, nodes=nodes, edges=edges,
               archive=[x for x in items if isinstance(x, ArchiveRow)],
               procedures=[x.data for x in items if isinstance(x, ProcedureRow)])
    assert out.getvalue() == data
    summary = verify_dump(io.BytesIO(data))
    assert (summary.nodes, summary.edges, summary.archive, summary.procedures) == (8, 10, 2, 2)


def test_small_dump_matches_its_generator():
    gen = _generator()
    rendered = gen.render()
    for name, data in rendered.items():
        assert (GOLDEN / name).read_bytes() == data, f"{name} no longer matches make_small_aaak.py"
    store = gen.build_store()
    items = list(read_dump(io.BytesIO(rendered["small.aaak"])))
    assert [x for x in items if isinstance(x, Node)] == store["nodes"]


def test_small_result_decodes_and_reencodes_byte_identically():
    text = (GOLDEN / "small_result.aaak").read_text(encoding="utf-8")
    result = decode(text, strict=True)
    assert result == _generator().build_result()
    assert encode(result) == text


def test_zettel_compress_v2_fixture():
    result = decode((GOLDEN / "zettel_v2.aaak").read_text(encoding="utf-8"), strict=True)
    assert result.entity_index.code_to_name["JLP"] == "Jean;Luc = Picard"
    z2 = result.zettels[1]
    assert z2.entities == ["Alice", "Jean;Luc = Picard"]
    assert z2.topics == ["token rotation", "pipe|topic"]
    assert z2.quote == 'She said "rotate hourly"\nthen left | for lunch \\ ok'
    assert (z2.source_start, z2.source_end, z2.weight) == (120, 480, 0.55)
    assert z2.emotions == ["fear", "relief"]
    assert decode(encode(result), strict=True) == result


def test_zettel_compress_v1_fixture():
    result = decode((GOLDEN / "zettel_v1.aaak").read_text(encoding="utf-8"), strict=True)
    assert [z.topics for z in result.zettels] == [["authentication", "security"], ["security", "deployment"]]
    assert result.meta["title"] == "Auth Design"
    assert decode(encode(result), strict=True) == result
