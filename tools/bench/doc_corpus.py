"""A document-corpus retrieval benchmark with graded relevance: nDCG@10 of recall.

    python tools/bench/doc_corpus.py --spaces hashed
    /work/venv-embed/bin/python tools/bench/doc_corpus.py --spaces hashed,random,minilm --json out.json

The corpus is two public-domain books (in the USA) from Project Gutenberg: *On the Origin
of Species* (#1228) and *Pride and Prejudice* (#1342), read at run time from
../shared/data/gutenberg (the shared data is never copied into the repository) and cut into
passages: the paragraphs of each book's body (``BOOKS``: where it starts and ends; the
novel's ``[Illustration: ...]`` blocks dropped), consecutive paragraphs joined until a
passage has at least ``MIN_WORDS`` words. Passage ``<book>/<n>`` is that book's n-th
passage; each book file's SHA-256 and its passages' digest are checked against the labels
file, so an id always means the same text. Both books go into one store (1,292 passages),
so each book's passages are distractors for the other's questions.

The questions and their graded labels (tools/bench/data/gutenberg_qrels.json; its
``about``, ``styles`` and ``batches`` say what each field means, how and when it was
built) were written for this project: 2 = the passage answers the question, 1 = it bears
on it, every unlabelled passage 0. Each question has a style (``lexical``, ``paraphrase``,
``multi``); figures are given overall and per style. ``check_labels`` validates the file
without the books (tests/test_doc_corpus_labels.py); ``--pool DEPTH`` prints each
question's pooled top passages of every system, for labelling.

Systems: ``bm25`` (no space), and per ``--spaces`` entry ``<space>-model`` (the space alone,
locomo_adapter.MODEL_ONLY) and ``<space>-fused`` (recall's default fusion). Each memory is
one passage; recall runs with its defaults (hops have no edges to spread over here).
For each space, fused is compared with the better of its parts (higher mean nDCG@10 over
the queries compared) by a seeded paired bootstrap over the queries
(tools/bench/paired.py): the mean per-query difference and its 95 % interval, overall and
within each style.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import sys
import tempfile
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import engramdb  # noqa: E402
from embed_cache import add_space, embedder_for  # noqa: E402
from locomo_adapter import MODEL_ONLY  # noqa: E402
from paired import Paired, best_single, paired_bootstrap  # noqa: E402

GUTENBERG = os.path.join(ROOT, "..", "shared", "data", "gutenberg")
QRELS = os.path.join(HERE, "data", "gutenberg_qrels.json")
MIN_WORDS = 120
K = 10
STYLES = ("lexical", "paraphrase", "multi")
ILLUSTRATION = re.compile(r"\[Illustration(?:[^\[\]]|\[[^\[\]]*\])*\]")


@dataclass(frozen=True)
class Book:
    """One book of the corpus: where its text starts and ends, and what to drop from it."""

    key: str  # the prefix of its passage ids ("origin/12")
    file: str  # under ../shared/data/gutenberg
    start: str  # the body starts after the line holding this (``after``) or at it
    end: str  # the body ends at the last occurrence of this
    after: bool
    illustrations: bool  # drop "[Illustration: ...]" blocks


BOOKS = (
    Book("origin", "origin_of_species_pg1228.txt", "*** START OF", "*** END OF", True, False),
    Book("pride", "pride_and_prejudice_pg1342.txt", "It is a truth universally acknowledged",
         "CHISWICK PRESS", False, True),
)


def read_labels(path: str = QRELS) -> dict:
    """The labels file as it is (no book needed): books, passage counts, queries (module doc)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    spec = json.loads(text)
    errors = check_labels(spec, text)
    if errors:
        raise SystemExit(f"{path}: " + "; ".join(errors[:10]))
    return spec


def passage_key(pid: str) -> tuple[int, str, int]:
    """Sort key of a passage id ``"<book>/<n>"``: the book's place in ``BOOKS``, then ``n``
    (malformed ids sort last instead of failing: ``check_labels`` reports them)."""
    book, _, n = pid.partition("/")
    keys = [b.key for b in BOOKS]
    return keys.index(book) if book in keys else len(keys), book, int(n) if n.isdigit() else -1


def canonical(spec: dict) -> str:
    """The labels file's one text for ``spec``: grades sorted by passage, one-space indent,
    UTF-8 as is, a final newline (``check_labels`` insists on it, so diffs stay small)."""
    queries = [{**q, "grades": dict(sorted(q["grades"].items(), key=lambda kv: passage_key(kv[0])))}
               for q in spec["queries"]]
    return json.dumps({**spec, "queries": queries}, indent=1, ensure_ascii=False) + "\n"


def check_labels(spec: dict, text: str | None = None) -> list[str]:
    """What is wrong with a labels file (empty: nothing), without reading the books: every
    labelled passage exists, every query has a grade-2 passage, grades are 1 or 2,
    styles are known, no id or question twice; ``text``, the file as read, is canonical."""
    errors: list[str] = []
    sizes = {b.key: spec.get("books", {}).get(b.key, {}).get("passages", 0) for b in BOOKS}
    seen_ids: set[str] = set()
    seen_queries: set[str] = set()

    def exists(pid: str) -> bool:
        book, _, n = pid.partition("/")
        return book in sizes and n.isdigit() and str(int(n)) == n and int(n) < sizes[book]

    for q in spec.get("queries", []):
        qid = q.get("id", "?")
        if qid in seen_ids:
            errors.append(f"{qid}: id used twice")
        seen_ids.add(qid)
        question = " ".join(q.get("query", "").lower().split())
        if not question or question in seen_queries:
            errors.append(f"{qid}: question empty or asked twice")
        seen_queries.add(question)
        if q.get("style") not in STYLES:
            errors.append(f"{qid}: style {q.get('style')!r} is not one of {STYLES}")
        grades = q.get("grades", {})
        errors += [f"{qid}: {pid} is not a passage" for pid in grades if not exists(pid)]
        errors += [f"{qid}: {pid} graded {g!r} (1 or 2)" for pid, g in grades.items() if g not in (1, 2)]
        if 2 not in grades.values():
            errors.append(f"{qid}: no passage answers it (grade 2)")
    if text is not None and text != canonical(spec):
        errors.append("the file is not in canonical form (doc_corpus.canonical)")
    return errors


def book_passages(book: Book, directory: str = GUTENBERG) -> list[str]:
    """The book's passages (module doc), whitespace inside a passage collapsed to single spaces."""
    with open(os.path.join(directory, book.file), encoding="utf-8") as f:
        text = f.read()
    at = text.index(book.start)
    start = text.index("\n", at) + 1 if book.after else at
    body = text[start:text.rindex(book.end)]
    if book.illustrations:
        body = ILLUSTRATION.sub("", body)
    out: list[str] = []
    current: list[str] = []
    for para in re.split(r"\n\s*\n", body):
        words = para.split()
        if not words:
            continue
        current += words
        if len(current) >= MIN_WORDS:
            out.append(" ".join(current))
            current = []
    if current:
        out.append(" ".join(current))
    return out


def passages_digest(texts: list[str]) -> str:
    """SHA-256 of a book's passages, one per line: the labels' ids mean these very texts."""
    return hashlib.sha256("\n".join(texts).encode("utf-8")).hexdigest()


def corpus(directory: str = GUTENBERG, path: str = QRELS) -> tuple[list[str], list[str]]:
    """``(ids, texts)`` of every book's passages, in ``BOOKS`` order, after checking each book
    file's SHA-256 and its passages' digest against the labels file."""
    spec = read_labels(path)
    ids: list[str] = []
    texts: list[str] = []
    for book in BOOKS:
        meta = spec["books"][book.key]
        with open(os.path.join(directory, book.file), "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        if digest != meta["sha256"]:
            raise SystemExit(f"{book.file}: SHA-256 {digest} is not the labelled edition's {meta['sha256']}")
        got = book_passages(book, directory)
        if len(got) != meta["passages"] or passages_digest(got) != meta["passages_sha256"]:
            raise SystemExit(f"{book.file}: cut into {len(got)} passages that are not the labelled ones")
        ids += [f"{book.key}/{n}" for n in range(len(got))]
        texts += got
    return ids, texts


def passages() -> list[str]:
    """Every passage of the corpus; memory ``p<i>`` holds ``passages()[i]``."""
    return corpus()[1]


def load_qrels(path: str = QRELS) -> dict:
    """The labels file with each query's ``grades`` keyed by the passage's position in
    ``passages()`` (as a string), after checking the books (``corpus``)."""
    spec = read_labels(path)
    position = {pid: str(i) for i, pid in enumerate(corpus(path=path)[0])}
    queries = [{**q, "grades": {position[p]: g for p, g in q["grades"].items()}} for q in spec["queries"]]
    return {**spec, "queries": queries}


RELEVANCE = {"graded": "grades as labelled (2, 1)", "strict": "only grade 2 counts (1 -> 0)",
             "binary": "every labelled passage counts fully (1 -> 2)"}


def relevance(grades: dict[str, int], how: str = "graded") -> dict[int, int]:
    """A query's grades (keyed by passage position) as ``ndcg`` takes them, counted ``how`` (``RELEVANCE``)."""
    if how not in RELEVANCE:
        raise ValueError(f"relevance {how!r} is not one of {sorted(RELEVANCE)}")
    out = {int(p): g for p, g in grades.items()}
    if how == "strict":
        return {p: g for p, g in out.items() if g == 2}
    return {p: 2 for p in out} if how == "binary" else out


def ndcg(ranked: list[int], grades: dict[int, int], k: int = K) -> float:
    """nDCG@k with gains ``2 ** grade - 1`` and discount ``log2(rank + 1)``."""
    dcg = sum((2 ** grades.get(d, 0) - 1) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sorted(grades.values(), reverse=True)[:k]
    idcg = sum((2 ** g - 1) / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def build(texts: list[str], tmp: str, space: str = "") -> engramdb.Engram:
    db = engramdb.open(os.path.join(tmp, f"corpus-{space or 'bm25'}.engram"), key=os.urandom(32))
    extra = add_space(db, embedder_for(space), texts) if space else [{} for _ in texts]
    db.add_many([{**extra[i], "id": f"p{i}", "content": t, "created_at": 1.0, "last_accessed": 1.0}
                 for i, t in enumerate(texts)])
    return db


def run(db: engramdb.Engram, queries: list[dict], fusion: engramdb.FusionWeights | None) -> list[list[int]]:
    return [[int(h.id[1:]) for h in db.recall(q["query"], top_k=K, fusion=fusion)] for q in queries]


def compare(out: dict, space: str, mask: list[bool]) -> tuple[str, Paired]:
    """``space``'s fused against the better of BM25 and the space alone over the queries in ``mask``."""
    def pick(name: str) -> list[float]:
        return [x for x, m in zip(out[name]["per_query"], mask) if m]
    parts = {"bm25": pick("bm25"), "model": pick(f"{space}-model")}
    best = best_single(*parts.values())
    return next(n for n, v in parts.items() if v is best), paired_bootstrap(pick(f"{space}-fused"), best)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spaces", default="hashed")
    ap.add_argument("--pool", type=int, default=0, metavar="DEPTH",
                    help="print each query's pooled top DEPTH passages of every system (for labelling)")
    ap.add_argument("--json", help="write per-query figures here")
    ap.add_argument("--relevance", choices=sorted(RELEVANCE), default="graded",
                    help="how grades count (RELEVANCE): a check that a conclusion does not hang on the grade-1 labels")
    args = ap.parse_args()
    spec = load_qrels()
    ids, texts = corpus()
    queries = spec["queries"]
    spaces = [s for s in args.spaces.split(",") if s]
    runs: dict[str, list[list[int]]] = {}
    with tempfile.TemporaryDirectory(prefix="engram-docs-") as tmp:
        runs["bm25"] = run(build(texts, tmp), queries, None)
        for space in spaces:
            emb = embedder_for(space).embedder
            if emb is not None:
                emb([q["query"] for q in queries])
            db = build(texts, tmp, space)
            runs[f"{space}-model"] = run(db, queries, MODEL_ONLY)
            runs[f"{space}-fused"] = run(db, queries, None)
    if args.pool:
        for qi, q in enumerate(queries):
            pool = sorted({d for r in runs.values() for d in r[qi][:args.pool]})
            labelled = {ids[int(p)]: g for p, g in q["grades"].items()}
            print(f"\n=== {q['id']} ({q['style']}) {q['query']}  labelled: {labelled}")
            for d in pool:
                print(f"--- {ids[d]}: {texts[d]}")
        return
    styles = [q["style"] for q in queries]
    counts = ", ".join(f"{styles.count(s)} {s}" for s in STYLES)
    print(f"{len(texts)} passages, {len(queries)} queries ({counts}), relevance {args.relevance}, "
          f"load {os.getloadavg()[0]:.1f}")
    out: dict = {}
    for name, ranked in runs.items():
        per_query = [ndcg(r, relevance(q["grades"], args.relevance)) for r, q in zip(ranked, queries)]
        out[name] = {"ndcg@10": round(sum(per_query) / len(per_query), 4),
                     "per_query": [round(x, 4) for x in per_query]}
    print("| signals | all | " + " | ".join(STYLES) + " |")
    print("|---|---:|" + "---:|" * len(STYLES))
    for name in runs:
        per_style = [sum(x for x, s in zip(out[name]["per_query"], styles) if s == style) / max(1, styles.count(style))
                     for style in STYLES]
        out[name]["by_style"] = {s: round(v, 4) for s, v in zip(STYLES, per_style)}
        print(f"| {name} | {out[name]['ndcg@10']:.3f} | " + " | ".join(f"{v:.3f}" for v in per_style) + " |")
    for space in spaces:
        for group in ("all",) + STYLES:
            mask = [group in ("all", s) for s in styles]
            if not any(mask):
                continue
            name, diff = compare(out, space, mask)
            out[f"{space}-fused"].setdefault("vs_best_single", {})[group] = {
                "best": name, "mean": round(diff.mean, 4), "ci95": [round(diff.low, 4), round(diff.high, 4)],
                "better": diff.better, "worse": diff.worse}
            print(f"{space}-fused - {name} (the better part), {group} ({sum(mask)}), paired bootstrap: {diff}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
