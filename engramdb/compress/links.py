"""Zettel tunnels and near-duplicate merging, on top of :mod:`engramdb.index.tunnels`.

Tunnel score of two zettels: ``max(1.2 * entity Jaccard, topic-token Jaccard)``, where
topic phrases are split into their words ("connection pool" and "connection timeout"
share "connection"). Labels name what is shared: two or more shared entities as codes
(``ALC+BOB``; names with ``verbose_labels``), else shared topics joined by ``_``
(prefixed by the one shared entity, if any), else shared topic words.

Candidates: every pair sharing an entity or topic word up to 500 zettels; above that,
MinHash/LSH run separately on the entity sets and on the topic-word sets, so a pair
linked by entities alone is not lost among differing topics.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from ..index.tunnels import (
    ESTIMATE_MARGIN,
    LSH_MIN_ITEMS,
    TokenSets,
    candidate_pairs,
    greedy_links,
    jaccard,
)
from ..records import ALL_EMOTIONS, ALL_FLAGS, EntityIndex, Tunnel, Zettel

__all__ = ["ENTITY_BOOST", "build_tunnels", "dedupe_tokens", "dedupe_zettels", "topic_tokens"]

ENTITY_BOOST = 1.2


def topic_tokens(topics: Sequence[str]) -> frozenset[str]:
    """The words of the topics (phrases split on spaces), two characters or longer."""
    return frozenset(w for t in topics for w in t.split() if len(w) >= 2)


def _scored_pairs(
    entity_sets: list[frozenset[str]], topic_sets: list[frozenset[str]], threshold: float
) -> Iterator[tuple[int, int, float]]:
    """Candidate pairs with their tunnel score, best first, as Python lists."""
    n = len(entity_sets)
    ents, tops = TokenSets(entity_sets), TokenSets(topic_sets)
    if n <= LSH_MIN_ITEMS:
        # exact: every pair sharing an entity or a topic word ("\x00" keeps the two apart)
        i, j = TokenSets([e | {"\x00" + t for t in ts} for e, ts in zip(entity_sets, topic_sets)]).candidates()
    else:
        ei, ej = ents.candidates(min_estimate=max(0.0, threshold / ENTITY_BOOST - ESTIMATE_MARGIN))
        ti, tj = tops.candidates(min_estimate=max(0.0, threshold - ESTIMATE_MARGIN))
        codes = np.unique(np.concatenate((ei * n + ej, ti * n + tj)))
        i, j = codes // n, codes % n
    score = np.maximum(ENTITY_BOOST * ents.jaccard(i, j), tops.jaccard(i, j))
    keep = (score > 0.0) & (score >= threshold)
    i, j, score = i[keep], j[keep], score[keep]
    order = np.lexsort((j, i, -score))  # best first, then (i, j)
    return zip(i[order].tolist(), j[order].tolist(), score[order].tolist())


def _label(a: Zettel, b: Zettel, index: EntityIndex, verbose: bool) -> str:
    def name(e: str) -> str:
        return e if verbose else index.name_to_code.get(e, e[:3].upper())

    b_entities = set(b.entities)
    shared = [e for e in a.entities if e in b_entities]
    if len(shared) >= 2:
        return "+".join(name(e) for e in shared[:3])
    b_topics = set(b.topics)
    phrases = [t for t in a.topics if t in b_topics]
    if phrases:
        joined = "_".join(phrases[:2])
        return f"{name(shared[0])}_{joined}" if shared else joined
    b_words = topic_tokens(b.topics)
    words: list[str] = []
    for t in a.topics:
        for w in t.split():
            if w in b_words and w not in words:
                words.append(w)
    if words:
        return "_".join(words[:2])
    return name(shared[0]) if shared else ""


def build_tunnels(
    zettels: Sequence[Zettel],
    index: EntityIndex,
    threshold: float = 0.3,
    top_k: int = 3,
    verbose_labels: bool = False,
) -> list[Tunnel]:
    """Tunnels between zettels (see the module docstring), sorted by zettel position."""
    if top_k == 0 or len(zettels) < 2:
        return []
    entity_sets = [frozenset(z.entities) for z in zettels]
    topic_sets = [topic_tokens(z.topics) for z in zettels]
    scored = _scored_pairs(entity_sets, topic_sets, threshold)
    links = greedy_links(scored, len(zettels), top_k)
    return [
        Tunnel(zettels[link.i].id, zettels[link.j].id, _label(zettels[link.i], zettels[link.j], index, verbose_labels))
        for link in links
    ]


def dedupe_tokens(z: Zettel) -> frozenset[str]:
    """The token set near-duplicate detection compares: quote words, topics, entities."""
    words = "".join(c if c.isalnum() or c == "_" else " " for c in z.quote.lower()).split()
    return frozenset(
        [w for w in words if len(w) >= 2] + [t.lower() for t in z.topics] + [e.lower() for e in z.entities]
    )


def _merge_into(keep: Zettel, drop: Zettel) -> None:
    keep.entities = sorted(set(keep.entities) | set(drop.entities))
    keep.topics = keep.topics + [t for t in drop.topics if t not in keep.topics]
    keep.weight = max(keep.weight, drop.weight)
    emotions, flags = set(keep.emotions) | set(drop.emotions), set(keep.flags) | set(drop.flags)
    keep.emotions = [e for e in ALL_EMOTIONS if e in emotions]
    keep.flags = [f for f in ALL_FLAGS if f in flags]


def dedupe_zettels(zettels: list[Zettel], threshold: float = 0.9) -> list[Zettel]:
    """Merge near-duplicates (token-set Jaccard >= ``threshold``), transitively.

    In each group the zettel with the highest weight (the earliest on ties) survives
    and absorbs the others' entities, topics, emotions and flags; survivors keep their
    order. The input zettels are not modified.
    """
    n = len(zettels)
    if n < 2:
        return list(zettels)
    sets = [dedupe_tokens(z) for z in zettels]
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    merged = False
    for i, j in candidate_pairs(sets, min_estimate=max(0.0, threshold - ESTIMATE_MARGIN)):
        if jaccard(sets[i], sets[j]) >= threshold:
            ri, rj = find(i), find(j)
            if ri != rj:
                parent[max(ri, rj)] = min(ri, rj)
                merged = True
    if not merged:
        return list(zettels)
    rep: dict[int, int] = {}
    for i in range(n):
        root = find(i)
        if root not in rep or zettels[i].weight > zettels[rep[root]].weight:
            rep[root] = i
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    out = []
    for i in range(n):
        root = find(i)
        if rep[root] != i:
            continue
        keep = Zettel(**{**vars(zettels[i]), "entities": list(zettels[i].entities), "topics": list(zettels[i].topics),
                         "emotions": list(zettels[i].emotions), "flags": list(zettels[i].flags)})
        for j in groups[root]:
            if j != i:
                _merge_into(keep, zettels[j])
        out.append(keep)
    return out
