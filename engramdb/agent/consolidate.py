"""Sleep consolidation: many fresh memories become a few dense core memories.

When the unconsolidated memories reach a threshold (default 50), ``consolidate_sleep``
groups them (the maintenance pass's clusters, completed to about ``target`` groups),
writes one core memory per group (through a ``Summarizer`` callable when given, else the
group's most representative sentences), links the core memory to each original with a
``derived_from`` edge and archives the originals: nothing is lost (``db.get(id,
full=True)``, ``db.unarchive(id)``). Semantics: spec/agent.md section 3.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Iterable

import numpy as np

from ..errors import DuplicateIdError, ValidationError
from ..index.vectors import HashedTfidfEmbedder, row_dots
from ..recall import as_int
from ..records import MAX_CONTENT_BYTES, Node, now_ts
from .models import call_model
from .protocols import AgentMemory
from .text import content_words, overlap, storable

__all__ = ["SleepReport", "Summarizer", "consolidate_sleep", "unconsolidated", "CORE_TAG"]

CORE_TAG = "core"
LIVE_TIERS = ("hot", "warm", "cold")
MAX_CORE = 700
Summarizer = Callable[[list[str]], str]
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")


@dataclass
class SleepReport:
    """What :func:`consolidate_sleep` did."""

    candidates: int
    threshold: int
    skipped: str | None = None
    cores: list[dict[str, Any]] = field(default_factory=list)
    archived: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"candidates": self.candidates, "threshold": self.threshold, "skipped": self.skipped,
                "cores": self.cores, "archived": self.archived}


def _check_summarizer(summarizer: object) -> None:
    if summarizer is not None and not callable(summarizer):
        raise ValidationError(f"the summarizer must be a callable or None, got a {type(summarizer).__name__}",
                              hint="pass a function list of texts -> one text, or None for extractive cores")


def unconsolidated(db: AgentMemory, *, tags: Iterable[str] | None = None) -> list[Node]:
    """The memories sleep consolidation would take: live (not archived), not pinned, not a
    core memory nor a member of one (unarchived by the user), carrying every tag in ``tags``;
    in insertion order.

    Raises:
        ValidationError: ``tags`` is a single string, or not a list of strings.
    """
    nodes = live_candidates(db, tags=tags)
    kept = _unarchived(db) if nodes else set()
    return [node for node in nodes if node.id not in kept]


def live_candidates(db: AgentMemory, *, tags: Iterable[str] | None = None) -> list[Node]:
    """:func:`unconsolidated` and the members of core memories the user unarchived: a bound
    from above that costs one scan less (the hooks test their threshold on it first).

    Raises:
        ValidationError: ``tags`` is a single string, or not a list of strings.
    """
    if tags is not None and (isinstance(tags, (str, bytes)) or not isinstance(tags, Iterable)):
        raise ValidationError("tags must be a list of tags, not a single string", hint='e.g. tags=["agent"]')
    return [node for node in db.scan(tiers=list(LIVE_TIERS), tags=list(tags) if tags else None)
            if not node.pinned and CORE_TAG not in node.tags]


def _unit(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.where(norms == 0, 1.0, norms)


def _sims(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``rows @ cols.T``, each pair's dot product computed as recall computes it (row_dots):
    BLAS moved a product by an ulp with the matrix's shape, so copies of one memory that
    lay as near to two groups went to either."""
    return np.stack([row_dots(rows, col) for col in cols], axis=1)


def _centroids(vectors: np.ndarray, groups: list[list[int]]) -> np.ndarray:
    return _unit(np.stack([vectors[g].sum(axis=0) for g in groups]))


def _groups(ids: list[str], vectors: np.ndarray, target: int) -> list[list[int]]:
    """About ``target`` groups covering every memory: the maintenance pass's clusters, more
    seeds by farthest-point when there are fewer, every other memory to its nearest
    centroid, then the smallest groups merged into their nearest until ``target`` remain."""
    from ..maintenance.lifecycle import MaintenanceConfig, Memory, cluster

    # cluster() takes warm and cold memories; every candidate here is one, whatever its tier
    memories = [Memory(id=i, embedding=tuple(map(float, v)), tier="warm") for i, v in zip(ids, vectors)]
    groups = [list(g) for g in cluster(memories, MaintenanceConfig(min_cluster_size=2))][:target]
    assigned = {i for g in groups for i in g}
    while len(groups) < target and len(assigned) < len(ids):
        rest = [i for i in range(len(ids)) if i not in assigned]
        if groups:
            sims = _sims(vectors[rest], _centroids(vectors, groups))
            seed = rest[int(np.argmin(sims.max(axis=1)))]  # the least covered; argmin takes the first tie
        else:
            seed = rest[0]
        groups.append([seed])
        assigned.add(seed)
    rest = [i for i in range(len(ids)) if i not in assigned]
    if rest:
        nearest = np.argmax(_sims(vectors[rest], _centroids(vectors, groups)), axis=1)
        for i, g in zip(rest, nearest.tolist()):
            groups[g].append(i)
    while len(groups) > target:
        smallest = min(range(len(groups)), key=lambda k: (len(groups[k]), -k))
        moving = groups.pop(smallest)
        sims = row_dots(_centroids(vectors, groups), _centroids(vectors, [moving])[0])
        groups[int(np.argmax(sims))].extend(moving)
    return [sorted(g) for g in sorted(groups, key=lambda g: (-len(g), min(g)))]


def _extractive(texts: list[str], embed: HashedTfidfEmbedder) -> str:
    """The group's most representative sentences (closest to its centroid), in their order."""
    sentences = [s.strip() for text in texts for s in _SENTENCE.split(text) if len(s.strip()) > 3]
    if not sentences:
        return " ".join(texts)[:MAX_CORE]
    vectors = _unit(embed(sentences))
    centroid = _unit(vectors.sum(axis=0, keepdims=True))[0]
    # one dot product per sentence, alone: its value does not depend on the other sentences
    order = sorted(range(len(sentences)), key=lambda k: (-float(vectors[k] @ centroid), k))
    chosen: list[int] = []
    size = 0
    for k in order:
        words = content_words(sentences[k])
        if any(overlap(words, content_words(sentences[c])) >= 0.8 for c in chosen):
            continue
        if size + len(sentences[k]) > MAX_CORE and chosen:
            continue
        chosen.append(k)
        size += len(sentences[k]) + 1
        if size >= MAX_CORE * 0.8:
            break
    return " ".join(_cut(sentences[k]) for k in sorted(chosen))


def _cut(sentence: str) -> str:
    """``sentence`` ending in a stop; one longer than a core memory (only ever the first one
    chosen) cut at a word to fit it, ending in "…"."""
    if len(sentence) > MAX_CORE:
        head = sentence[:MAX_CORE - 1]
        return (head.rsplit(" ", 1)[0] if " " in head else head) + "…"
    return sentence if sentence.endswith((".", "!", "?")) else sentence + "."


def _stale(current: Node | None, planned: Node) -> bool:
    """Whether a member read again in the write transaction is no longer the live memory its
    group was planned (and summarized) from."""
    return current is None or current.tier not in LIVE_TIERS or current.content != planned.content


def _cores(db: AgentMemory) -> Iterable[tuple[Node, list[str], bool]]:
    """(core memory, the ids in its ``consolidated_from``, whether it is ``complete``) of every
    core memory, in insertion order."""
    for core in db.scan(tags=[CORE_TAG]):
        agent = core.metadata.get("agent") if isinstance(core.metadata, dict) else None
        if not isinstance(agent, dict):
            continue
        members = agent.get("consolidated_from")
        if isinstance(members, list):
            yield core, [m for m in members if isinstance(m, str)], agent.get("complete") is True


def _unarchived(db: AgentMemory, cores: Iterable[tuple[Node, list[str], bool]] | None = None) -> set[str]:
    """Members of complete core memories (written with their members archived, in one commit):
    one that is live again was unarchived by the user, and stays so."""
    return {member for _, members, complete in (_cores(db) if cores is None else cores) if complete
            for member in members}


def _interrupted(cores: Iterable[tuple[Node, list[str], bool]]) -> dict[str, Node]:
    """Member id -> the core memory consolidated from it, for core memories written before
    session 8 (one write each for the core, its edges and each archive, so a run could stop
    between them); the first core by insertion order when two claim one member."""
    owner: dict[str, Node] = {}
    for core, members, complete in cores:
        if not complete:
            for member in members:
                owner.setdefault(member, core)
    return owner


def consolidate_sleep(db: AgentMemory, *, threshold: int = 50, target: int = 5, summarizer: Summarizer | None = None,
                      tags: Iterable[str] | None = None, force: bool = False, now: float | None = None) -> SleepReport:
    """Turn the unconsolidated memories into about ``target`` core memories once there are
    ``threshold`` of them (``force=True``: whatever their number, at least 2).

    Each core memory (tags ``agent`` and ``core``, id ``core-<hash of its members' ids>``)
    has a ``derived_from`` edge to each original, and the originals are archived, in one
    commit per core memory; a member the user unarchives later stays live. Members that a
    run of an older version, interrupted, left live are archived under their core memory first.

    Every summary is made before anything is written: a summarizer that raises or does
    not return text leaves the file as it was.

    Raises:
        ValidationError: bad arguments, or a summarizer that raises (its exception is the cause)
            or does not return text; nothing is written then.
    """
    threshold_n, target_n = as_int(threshold), as_int(target)  # NumPy's ints too; never a bool
    if threshold_n is None or threshold_n < 2:
        raise ValidationError(f"threshold must be an int of at least 2, got {threshold!r}")
    if target_n is None or target_n < 1:
        raise ValidationError(f"target must be a positive int, got {target!r}")
    threshold, target = threshold_n, target_n
    _check_summarizer(summarizer)
    stamp = now_ts(now)
    nodes = live_candidates(db, tags=tags)
    cores = list(_cores(db)) if nodes else []
    kept = _unarchived(db, cores)
    nodes = [node for node in nodes if node.id not in kept]
    report = SleepReport(candidates=len(nodes), threshold=threshold)
    if len(nodes) < (2 if force else threshold):
        report.skipped = (f"{len(nodes)} unconsolidated memories; "
                          + ("a forced sleep consolidation needs at least 2" if force
                             else f"sleep consolidation runs at {threshold}"))
        return report
    # members of a core memory that an interrupted run wrote but did not archive: finished
    # under that core (regrouped, they would get a second core saying the same)
    owner = _interrupted(cores)
    resumed: dict[str, tuple[Node, list[Node]]] = {}
    for node in nodes:
        if node.id in owner:
            resumed.setdefault(owner[node.id].id, (owner[node.id], []))[1].append(node)
    for core_id, (core, members) in sorted(resumed.items()):
        for member in members:
            db.link(core_id, member.id, "derived_from", now=stamp)
            db.archive(member.id, now=stamp)
        report.archived += len(members)
        report.cores.append({"id": core_id, "derived_from": [m.id for m in members], "content": core.content,
                             "resumed": True})
    nodes = [node for node in nodes if node.id not in owner]
    if not nodes:
        return report
    embed = HashedTfidfEmbedder(dims=512)
    contents = [node.content for node in nodes]
    vectors = _unit(embed(contents))
    # every summary first, then the writes: a summarizer that fails (or returns no text) on
    # a later group must not leave the earlier groups consolidated behind the error
    planned: list[tuple[list[Node], str]] = []
    for group in _groups([n.id for n in nodes], vectors, min(target, len(nodes))):
        members = [nodes[i] for i in group]
        texts = [m.content for m in members]
        if summarizer is not None:
            summary = call_model(summarizer, texts, "summarizer")
            if not isinstance(summary, str) or not summary.strip():
                got = "an empty text" if isinstance(summary, str) else f"{type(summary).__name__}, not text"
                raise ValidationError(f"the summarizer returned {got}",
                                      hint="a Summarizer takes a list of texts and returns one non-empty string")
            if len(summary) > MAX_CONTENT_BYTES:  # refused by the write below, after earlier groups' commits
                raise ValidationError(f"the summarizer returned {len(summary)} characters; a memory holds at most "
                                      f"{MAX_CONTENT_BYTES}", hint="return a summary, not the texts themselves")
            # half an escaped surrogate pair in a model's output: the file cannot encode it, and
            # the write below would fail after earlier groups' commits
            summary = storable(summary)
        else:
            summary = _extractive(texts, embed)
        planned.append((members, summary))
    for members, summary in planned:
        ids = [m.id for m in members]
        core_id = "core-" + hashlib.sha256("\x00".join(sorted(ids)).encode("utf-8", "surrogatepass")).hexdigest()[:16]
        # the core, its edges and the archiving in one commit: "complete" then means its members
        # were archived, so one found live later was unarchived by the user (left alone)
        exists = core_id in db  # a memory the user made from a core (its tag or metadata changed)
        try:
            with db.transaction() as tx:
                # planned outside this commit (a summarizer may be a model call, seconds long):
                # another run (process, thread, target) may have consolidated a member meanwhile,
                # or the user changed or forgot one. Then the group waits for the next run, whole:
                # written, a member would be in two core memories, or under a summary of an old text.
                if any(_stale(tx.find(m.id), m) for m in members):
                    continue
                if not exists:
                    tx.add(summary, id=core_id, now=stamp, tags=["agent", CORE_TAG],
                           importance=max(m.importance for m in members),
                           metadata={"agent": {"kind": "core", "consolidated_from": ids, "at": stamp,
                                               "complete": True}})
                for member in members:
                    tx.link(core_id, member.id, "derived_from", now=stamp)
                for member in members:
                    tx.archive(member.id, now=stamp)
        except DuplicateIdError:
            continue  # another run (process, thread) wrote this core and archived its members meanwhile
        report.archived += len(members)
        report.cores.append({"id": core_id, "derived_from": ids, "content": summary})
    return report
