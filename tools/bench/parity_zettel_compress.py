"""Parity of ``engramdb.compress`` with zettel-compress 1.0.0, field by field.

Run from the repository root (about a minute):

    python tools/bench/parity_zettel_compress.py            # a markdown table
    python tools/bench/parity_zettel_compress.py --only pride_and_prejudice_pg1342 --json

The oracle is ``../shared/data/zettel-compress/`` (its README says how each file was
made): for the two books and five LoCoMo dev conversations, zettel-compress's own
``compress()`` result, and for the books its ``injectContext`` (budget 300, three
formats), ``wakeUp`` and ``recall`` (top 5) outputs.

For every input the table gives: zettel counts; then, per field, the share of zettels
(matched by position) on which engramdb and zettel-compress agree: chunk offsets,
entities, topics, quote, weight, flags, emotions, resolved date; tunnels (share of the
reference's tunnels engramdb produces, with the same label); whether ``inject_context``
and ``wake_up`` give the same text; recall top-5 overlap.

**Intended differences.** engramdb departs from zettel-compress where spec/compress.md
section 15 lists a fix (a name, its reason and an example). The script runs
``compress`` twice: with the default fixes and with ``fixes=()`` (zettel-compress
exactly). A field that differs from the reference by default but matches with
``fixes=()`` is counted as *intended*, and only if every default fix is listed in the
spec; a fix missing from the spec makes the script fail. ``agree`` = identical +
intended.

Reference offsets count UTF-16 code units (JavaScript); they are converted to code
points (engramdb's offsets) before comparing.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engramdb.compress import compress, inject_context, wake_up  # noqa: E402  (after the sys.path line above)
from engramdb.compress.options import CompressOptions  # noqa: E402  (after the sys.path line above)
from engramdb.records import CompressResult  # noqa: E402  (after the sys.path line above)

DATA = ROOT.parent / "shared" / "data"
ORACLE = DATA / "zettel-compress"
BOOKS = ("pride_and_prejudice_pg1342", "origin_of_species_pg1228")
CHATS = ("locomo-conv-26", "locomo-conv-30", "locomo-conv-41", "locomo-conv-42", "locomo-conv-43")
INPUTS = BOOKS + CHATS
FIELDS = ("offsets", "entities", "topics", "quote", "weight", "flags", "emotions", "resolved_date")
SPEC = ROOT / "spec" / "compress.md"


def listed_fixes(spec: Path = SPEC) -> set[str]:
    """Fix names in the intended-differences table of spec/compress.md (section 15)."""
    text = spec.read_text(encoding="utf-8")
    m = re.search(r"^## 15\..*?(?=^## |\Z)", text, re.M | re.S)
    if not m:
        return set()
    return set(re.findall(r"^\|\s*`([a-z0-9-]+)`\s*\|[^|\n]+\|[^|\n]+\|", m.group(0), re.M))


def input_text(name: str) -> tuple[str, dict[str, Any]]:
    """The text zettel-compress was given, and the compress options it used."""
    if name in BOOKS:
        return (DATA / "gutenberg" / f"{name}.txt").read_text(encoding="utf-8"), {}
    ref = json.loads((ORACLE / f"{name}.compress.json").read_text(encoding="utf-8"))
    return (ORACLE / f"{name}.input.txt").read_text(encoding="utf-8"), {"date": ref["meta"]["date"]}


def _u16_to_cp(text: str) -> dict[int, int]:
    pre = [0, *accumulate(2 if ord(c) > 0xFFFF else 1 for c in text)]
    return {u: i for i, u in enumerate(pre)}


def _view(z: Any, *, ref: bool, conv: dict[int, int] | None = None) -> dict[str, Any]:
    if ref:
        start, end = z.get("sourceStart"), z.get("sourceEnd")
        if conv is not None:
            start, end = conv.get(start, start), conv.get(end, end)
        return {
            "offsets": (start, end), "entities": z["entities"], "topics": z["topics"], "quote": z["quote"],
            "weight": z["weight"], "flags": z["flags"], "emotions": z["emotions"],
            "resolved_date": z.get("resolvedDate"),
        }
    return {
        "offsets": (z.source_start, z.source_end), "entities": z.entities, "topics": z.topics, "quote": z.quote,
        "weight": z.weight, "flags": z.flags, "emotions": z.emotions, "resolved_date": z.resolved_date,
    }


@dataclass
class Row:
    name: str
    ref_zettels: int
    zettels: int
    same: dict[str, int] = field(default_factory=dict)
    intended: dict[str, int] = field(default_factory=dict)
    tunnels_ref: int = 0
    tunnels: int = 0
    tunnels_same: int = 0
    tunnels_intended: int = 0
    pure_same: dict[str, int] = field(default_factory=dict)
    pure_tunnels_same: int = 0
    pure_tunnels: int = 0
    inject: dict[str, bool] = field(default_factory=dict)
    wake_up: bool | None = None
    recall: float | None = None
    examples: dict[str, list[Any]] = field(default_factory=dict)

    def share(self, f: str, intended: bool = True) -> float:
        n = min(self.ref_zettels, self.zettels)
        if n == 0:
            return 1.0 if self.ref_zettels == self.zettels else 0.0
        return (self.same.get(f, 0) + (self.intended.get(f, 0) if intended else 0)) / self.ref_zettels


def _recall(result: CompressResult, query: str) -> list[str]:
    import engramdb

    fn = getattr(engramdb, "recall_result", None)
    if fn is None:
        from engramdb.compress.recall import recall_result as fn  # type: ignore[no-redef]
    return [z.id for z in fn(result, query, top_k=5)]


def compare(name: str, examples: int = 0, pure_only: bool = False) -> Row:
    text, options = input_text(name)
    ref = json.loads((ORACLE / f"{name}.compress.json").read_text(encoding="utf-8"))
    default_fixes = () if pure_only else CompressOptions().fixes
    ours = compress(text, fixes=default_fixes, **options)
    pure = compress(text, fixes=(), **options) if default_fixes else ours
    conv = _u16_to_cp(text) if any(ord(c) > 0xFFFF for c in text) else None
    rz = [_view(z, ref=True, conv=conv) for z in ref["zettels"]]
    oz = [_view(z, ref=False) for z in ours.zettels]
    pz = [_view(z, ref=False) for z in pure.zettels]
    row = Row(name, len(rz), len(oz))
    for f in FIELDS:
        row.pure_same[f] = sum(1 for k in range(min(len(rz), len(pz))) if pz[k][f] == rz[k][f])
        row.same[f] = row.intended[f] = 0
        for k in range(min(len(rz), len(oz))):
            if oz[k][f] == rz[k][f]:
                row.same[f] += 1
            elif k < len(pz) and pz[k][f] == rz[k][f]:
                row.intended[f] += 1
            elif len(row.examples.setdefault(f, [])) < examples:
                row.examples[f].append((ref["zettels"][k]["id"], rz[k][f], oz[k][f]))
    ref_t = {(t["from"], t["to"], t["label"]) for t in ref["tunnels"]}
    our_t = {(t.from_id, t.to_id, t.label) for t in ours.tunnels}
    pure_t = {(t.from_id, t.to_id, t.label) for t in pure.tunnels}
    row.tunnels_ref, row.tunnels, row.tunnels_same = len(ref_t), len(our_t), len(ref_t & our_t)
    row.tunnels_intended = len((ref_t - our_t) & pure_t)
    row.pure_tunnels_same, row.pure_tunnels = len(ref_t & pure_t), len(pure_t)
    inject_path = ORACLE / f"{name}.inject300.json"
    if inject_path.exists():
        inj = json.loads(inject_path.read_text(encoding="utf-8"))
        for fmt, want in inj.items():
            row.inject[fmt] = inject_context(ours, max_token_budget=300, format=fmt) == want
    wake_path = ORACLE / f"{name}.wakeup.txt"
    if wake_path.exists():
        row.wake_up = wake_up(ours) == wake_path.read_text(encoding="utf-8")
    recall_path = ORACLE / f"{name}.recall.json"
    if recall_path.exists():
        queries = json.loads(recall_path.read_text(encoding="utf-8"))
        shares = []
        for q, want in queries.items():
            got = _recall(ours, q)
            shares.append(1.0 if not want and not got else len(set(want) & set(got)) / max(len(want), 1))
        row.recall = sum(shares) / len(shares)
    return row


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def table(rows: list[Row]) -> str:
    head = ["input", "zettels (ref/ours)", *FIELDS, "tunnels", "inject aaak/md/json", "wake_up", "recall@5"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.name, f"{r.ref_zettels}/{r.zettels}"]
        for f in FIELDS:
            cell = _pct(r.share(f, intended=False))
            if r.intended.get(f):
                cell += f" (+{_pct(r.intended[f] / max(r.ref_zettels, 1))} intended)"
            cells.append(cell)
        cell = f"{_pct(r.tunnels_same / max(r.tunnels_ref, 1))}"
        if r.tunnels_intended:
            cell += f" (+{_pct(r.tunnels_intended / max(r.tunnels_ref, 1))} intended)"
        cells.append(cell + f"; {r.tunnels_same}/{r.tunnels_ref}, ours {r.tunnels}")
        cells.append("/".join("yes" if r.inject[f] else "no" for f in ("aaak", "markdown", "json")) if r.inject else "-")
        cells.append("-" if r.wake_up is None else ("yes" if r.wake_up else "no"))
        cells.append("-" if r.recall is None else _pct(r.recall))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def check_thresholds(row: Row, share: float = 0.9) -> list[str]:
    """The issue's goal for one input: what falls short (empty when it is met)."""
    bad = []
    if row.zettels != row.ref_zettels:
        bad.append(f"{row.name}: {row.zettels} zettels, reference {row.ref_zettels}")
    if row.same["offsets"] != row.ref_zettels:
        bad.append(f"{row.name}: offsets identical on {row.same['offsets']}/{row.ref_zettels}")
    for f in FIELDS[1:]:
        if row.share(f) < share:
            bad.append(f"{row.name}: {f} agrees on {_pct(row.share(f))} % (< {_pct(share)} %)")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", action="append", choices=INPUTS, help="compare only these inputs")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--examples", type=int, default=0, help="print up to N differing zettels per field")
    ap.add_argument("--no-fixes", action="store_true", help="compare compress(fixes=()): zettel-compress exactly")
    args = ap.parse_args(argv)
    if not ORACLE.is_dir():
        print(f"no oracle data at {ORACLE}", file=sys.stderr)
        return 2
    unlisted = set(CompressOptions().fixes) - listed_fixes()
    if unlisted:
        print(f"default fixes not listed in spec/compress.md section 15: {sorted(unlisted)}", file=sys.stderr)
        return 1
    rows = [compare(n, args.examples, args.no_fixes) for n in (args.only or INPUTS)]
    if args.json:
        print(json.dumps([r.__dict__ for r in rows], indent=1, default=list))
    else:
        print(table(rows))
        for r in rows:
            for f, ex in r.examples.items():
                for zid, want, got in ex:
                    print(f"{r.name} {zid} {f}:\n  ref : {want!r}\n  ours: {got!r}")
        bad = [b for r in rows for b in check_thresholds(r)]
        print("\nthresholds: " + ("met on every input" if not bad else "NOT met:\n  " + "\n  ".join(bad)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
