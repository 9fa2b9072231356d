"""Terronex .engram import: the files Terronex's own writer made (../shared/data/terronex/, format 1.x)
and format 2.x fixtures in the public 2.x writer's layout (tests/fixtures/terronex/)."""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import engramdb
from engramdb.backup import import_records
from engramdb.cli import cli
from engramdb.errors import ImportFormatError, ModeMismatchError, WrongPassphraseError
from engramdb.importers import ImportReport, iter_import, iter_terronex
from engramdb.records import Edge, Node

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "terronex"
V2 = Path(__file__).resolve().parent / "fixtures" / "terronex"
SHARED_PASSWORD = "terronex-pw-1"
V2_PASSWORD = "terronex-v2-pw"
CREATED = 1_768_003_200.0  # 2026-01-10T00:00:00Z
F32 = np.float32
EXPECTED = {  # id -> (content, tier, importance, embedding)
    "n1": ("We decided to use JWT tokens for auth.", "hot", 0.9, (1.0, 0.0, 0.0, 0.0)),
    "n2": ("Alice moved to Berlin in 2023.", "warm", 0.4, (0.0, 1.0, 0.0, 0.0)),
    "n3": ("Token rotation is hourly.", "cold", 0.6, (float(F32(0.9)), float(F32(0.1)), 0.0, 0.0)),
}


def _shared(name: str) -> bytes:
    path = SHARED / name
    if not path.exists():
        pytest.skip(f"the Terronex reference files {SHARED} are not beside this checkout")
    return path.read_bytes()


def _split(items):
    items = list(items)
    return [x for x in items if isinstance(x, Node)], [x for x in items if isinstance(x, Edge)]


def _check_three(nodes, edges, *, v2=False):
    assert [n.id for n in nodes] == ["n1", "n2", "n3"]
    for n in nodes:
        content, tier, importance, vec = EXPECTED[n.id]
        assert (n.content, n.tier, n.importance) == (content, tier, importance)
        assert {k: tuple(v.tolist()) for k, v in n.embeddings.items()} == {"default": vec}
        assert n.tags == ("demo", "auth") and n.created_at == CREATED
    got = {(e.src, e.dst, e.kind, e.label, e.weight) for e in edges}
    want = {("n3", "n1", "part_of", "", 1.0), ("n3", "n1", "derived_from", "elaborates", 0.8)}
    if v2:
        want |= {("n3", "n1", "related", "supports", 0.7), ("n1", "n2", "related", "similar_to", 0.5),
                 ("n2", "n1", "related", "similar_to", 0.5), ("n2", "n3", "derived_from", "", 1.0)}
    assert got == want


@pytest.mark.parametrize("name,password", [("plain_list.engram", None), ("enc_list.engram", SHARED_PASSWORD)])
def test_number_list_files_import_exactly(name, password):
    _check_three(*_split(iter_terronex(_shared(name), passphrase=password)))


def test_ext_0x74_file_imports_exactly():
    nodes, edges = _split(iter_terronex(_shared("ext74.engram")))
    assert [(n.id, n.content, tuple(n.embeddings["default"].tolist())) for n in nodes] == [
        ("a", "alpha", (1.0, 0.0, 0.0, 0.0)), ("b", "beta", (float(F32(0.9)), float(F32(0.1)), 0.0, 0.0))]
    assert edges == []


@pytest.mark.parametrize("name,password", [("plain.engram", None), ("enc.engram", SHARED_PASSWORD)])
def test_msgpackr_damaged_float32array_embeddings_are_reported_not_imported(name, password):
    data = _shared(name)
    with pytest.raises(ImportFormatError) as info:
        list(iter_terronex(data, passphrase=password))
    message = info.value.message
    assert "3 embedding(s)" in message and all(f"node {nid}:" in message for nid in ("n1", "n2", "n3"))
    assert "--skip-bad-embeddings" in info.value.hint
    report = ImportReport()
    nodes, _edges = _split(iter_terronex(data, passphrase=password, skip_bad_embeddings=True, report=report))
    assert [nid for nid, _ in report.bad_embeddings] == ["n1", "n2", "n3"]
    assert [n.id for n in nodes] == ["n1", "n2", "n3"] and all(n.embeddings == {} for n in nodes)
    assert [n.content for n in nodes] == [EXPECTED[n.id][0] for n in nodes]


@pytest.mark.parametrize("name,password", [("v2_plain.engram", None), ("v2_1_plain.engram", None),
                                           ("v2_argon2id.engram", V2_PASSWORD), ("v2_pbkdf2.engram", V2_PASSWORD)])
def test_format_2x_files_import_exactly(name, password):
    nodes, edges = _split(iter_terronex((V2 / name).read_bytes(), passphrase=password))
    _check_three(nodes, edges, v2=True)
    n1 = nodes[0].metadata["terronex"]
    assert n1["position"] == {"x": 1.5, "y": -2.0, "pinned": True} and n1["confidence"] == 0.85


def test_format_2x_encrypted_needs_the_right_password():
    data = (V2 / "v2_pbkdf2.engram").read_bytes()
    with pytest.raises(ModeMismatchError):
        list(iter_terronex(data))
    with pytest.raises(WrongPassphraseError):
        list(iter_terronex(data, passphrase="wrong"))


def test_format_2x_bad_embeddings_name_their_nodes():
    data = (V2 / "v2_bad_embeddings.engram").read_bytes()
    with pytest.raises(ImportFormatError, match=r"2 embedding\(s\).*node n2: 3 values where the file declares 4.*"
                                               r"node n3: values that are not finite"):
        list(iter_terronex(data))
    report = ImportReport()
    nodes = [x for x in iter_import(io.BytesIO(data), skip_bad_embeddings=True, report=report)
             if isinstance(x, Node)]
    assert [(n.id, bool(n.embeddings)) for n in nodes] == [("n1", True), ("n2", False), ("n3", False)]
    assert len(report.bad_embeddings) == 2


def test_unknown_major_version_is_refused():
    data = bytearray((V2 / "v2_plain.engram").read_bytes())
    data[6] = 3
    with pytest.raises(ImportFormatError, match=r"3\.0 is not supported"):
        list(iter_terronex(bytes(data)))


def test_a_plausible_raw_float32_embedding_is_kept():
    from test_importers import terronex_file, tx_node

    vec = np.array([0.25, -1.5, 3.0], dtype="<f4")
    nodes, _ = _split(iter_terronex(terronex_file([tx_node("x", "y", embedding=vec.tobytes())])))
    assert nodes[0].embeddings["default"].tolist() == [0.25, -1.5, 3.0]
    for bad in (np.array([1e-44, 1.0, 0.5], "<f4"), np.array([0, 0, 0], "<f4"), np.array([1e30, 1, 1], "<f4")):
        with pytest.raises(ImportFormatError, match="node x: float32 bytes"):
            list(iter_terronex(terronex_file([tx_node("x", "y", embedding=bad.tobytes())])))


def test_cli_import_stops_on_bad_embeddings_unless_told(tmp_path):
    env = {"ENGRAM_PASSPHRASE": "pw", "ENGRAM_TEST_WEAK_KDF": "1"}
    runner = CliRunner()
    store = tmp_path / "s.engram"
    assert runner.invoke(cli, ["init", str(store), "--kdf", "t=1,m=8,p=1"], env=env).exit_code == 0
    src = str(V2 / "v2_bad_embeddings.engram")
    stopped = runner.invoke(cli, ["import", src, str(store)], env=env)
    assert stopped.exit_code == 1 and "node n2" in stopped.output and "--skip-bad-embeddings" in stopped.output
    done = runner.invoke(cli, ["import", src, str(store), "--skip-bad-embeddings", "--json"], env=env)
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout) == {"file": str(store), "memories": 3, "edges": 6, "bad_embeddings": 2, "warnings": 0}
    assert "memory n2 imported without its embedding" in done.stderr


def test_import_records_of_a_2x_file_into_a_store(make_db):
    db = make_db()
    nodes, edges = import_records(db, iter_terronex((V2 / "v2_plain.engram").read_bytes()))
    assert (nodes, edges) == (3, 6)
    assert tuple(db.get("n3").embeddings["default"].tolist()) == EXPECTED["n3"][3]
    assert [h.id for h in db.recall("JWT tokens auth", top_k=1)] == ["n1"]
    assert isinstance(engramdb.Engram, type)
