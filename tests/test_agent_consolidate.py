"""Sleep consolidation: it fires at the threshold, makes about five core memories linked by
derived_from edges, and the originals are archived, never lost."""
from __future__ import annotations

import numpy as np
import pytest

from engramdb.agent import MemoryHooks, ProceduralGraph, consolidate_sleep, unconsolidated
from engramdb.errors import ValidationError
from engramdb.records import MAX_CONTENT_BYTES

TOPICS = {
    "garden": "Alice waters the tomato garden every {} morning and the basil needs shade.",
    "deploy": "The deploy pipeline runs the docker build on {} and pushes to the registry.",
    "budget": "The quarterly budget review for {} found the cloud invoice doubled.",
    "travel": "Bob booked the train to Lisbon for {} and the hotel near the river.",
    "recipes": "The sourdough recipe needs a {} starter feeding and a long cold proof.",
}
DAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday", "holiday", "rainy", "sunny"]


def _memories(db, now, n_per_topic=10):
    ids = {}
    for topic, template in TOPICS.items():
        for k in range(n_per_topic):
            ids[db.remember(template.format(DAYS[k]), id=f"{topic}-{k}", now=now + k)] = topic
    return ids


def test_nothing_happens_below_the_threshold(tmp_engram, now):
    ids = _memories(tmp_engram, now)
    tmp_engram.remember("one pinned memory", pinned=True, now=now)
    report = consolidate_sleep(tmp_engram, threshold=51, now=now)
    assert report.skipped == "50 unconsolidated memories; sleep consolidation runs at 51"
    assert report.cores == [] and all(tmp_engram.get(i).tier == "hot" for i in ids)


def test_consolidation_fires_at_the_threshold_and_loses_nothing(tmp_engram, now):
    ids = _memories(tmp_engram, now)
    originals = {i: tmp_engram.get(i) for i in ids}
    report = consolidate_sleep(tmp_engram, threshold=50, now=now + 100)
    assert report.skipped is None and report.candidates == 50 and report.archived == 50
    assert 3 <= len(report.cores) <= 5
    covered = [i for core in report.cores for i in core["derived_from"]]
    assert sorted(covered) == sorted(ids)  # every original in exactly one core
    for core in report.cores:
        node = tmp_engram.get(core["id"])
        assert {"agent", "core"} <= set(node.tags) and node.content == core["content"] and node.content
        topics = {ids[i] for i in core["derived_from"]}
        assert len(topics) <= 2, topics  # groups follow the topics
        assert any(s in node.content for i in core["derived_from"] for s in originals[i].content.split(" and "))
        edges = tmp_engram.edges(core["id"])
        assert sorted(e.dst for e in edges if e.kind == "derived_from") == sorted(core["derived_from"])
    for i, before in originals.items():
        stub = tmp_engram.get(i)
        assert stub.tier == "archive"
        assert tmp_engram.get(i, full=True) == before  # recoverable byte for byte
    assert unconsolidated(tmp_engram) == []
    assert tmp_engram.unarchive("garden-3") == originals["garden-3"]
    # core memories are not consolidated again, nor a member the user unarchived (it has its
    # core), and a second run has nothing to do
    assert consolidate_sleep(tmp_engram, threshold=2, now=now + 200).skipped == \
        "0 unconsolidated memories; sleep consolidation runs at 2"


def test_a_summarizer_writes_the_core_memories(tmp_engram, now):
    _memories(tmp_engram, now, n_per_topic=2)
    calls = []

    def summarizer(texts):
        calls.append(texts)
        return f"{len(texts)} memories about " + texts[0].split()[1]

    report = consolidate_sleep(tmp_engram, threshold=10, target=5, summarizer=summarizer, now=now)
    assert sum(map(len, calls)) == 10 and len(report.cores) == len(calls) <= 5
    assert all(tmp_engram.get(c["id"]).content.endswith(")") is False for c in report.cores)
    assert {tmp_engram.get(c["id"]).content for c in report.cores} == {c["content"] for c in report.cores}
    with pytest.raises(ValidationError, match="summarizer returned"):
        tmp_engram.remember("a b c", now=now)
        tmp_engram.remember("d e f", now=now)
        consolidate_sleep(tmp_engram, threshold=2, summarizer=lambda texts: None, now=now)


def test_the_hooks_consolidate_once_the_threshold_is_reached(tmp_engram, now):
    hooks = MemoryHooks(tmp_engram, sleep_threshold=12, tags=())  # no tags: every memory counts
    _memories(tmp_engram, now, n_per_topic=2)
    assert hooks.after_task([{"role": "user", "content": "Summarise the notes."}], now=now) != []
    assert [n for n in tmp_engram.scan() if "core" in n.tags] == []  # 11 so far
    hooks.after_task([{"role": "user", "content": "Plan the garden beds. Use only raised beds."}], now=now + 1)
    cores = [n for n in tmp_engram.scan() if "core" in n.tags]
    assert cores and unconsolidated(tmp_engram) == []
    with pytest.raises(ValidationError):
        MemoryHooks(tmp_engram, sleep_threshold=1)


def test_the_hooks_leave_the_users_own_memories_alone(tmp_engram, now):
    # regression: hooks with the default tags ("agent",) consolidated (archived) every live
    # memory of the store once there were sleep_threshold of them, the user's own included
    user = _memories(tmp_engram, now, n_per_topic=4)
    hooks = MemoryHooks(tmp_engram, sleep_threshold=3)
    facts = []
    for i, task in enumerate(["Plan the garden beds. Use only raised beds.",
                              "Deploy on friday. Never deploy on a holiday.",
                              "Book the Lisbon train. Always pick a window seat."]):
        facts += hooks.after_task([{"role": "user", "content": task}], now=now + 10 + i)
    cores = [n for n in tmp_engram.scan() if "core" in n.tags]
    assert len(facts) >= 3 and cores  # the agent's facts were consolidated
    members = [i for core in cores for i in core.metadata["agent"]["consolidated_from"]]
    assert members and all("agent" in tmp_engram.get(i).tags for i in members)
    assert {n.id for n in unconsolidated(tmp_engram)} >= set(user)  # every user memory still live


@pytest.mark.parametrize("failure", ["bad value", "raises", "too long"])
def test_a_summarizer_that_fails_on_a_later_group_leaves_the_file_untouched(tmp_engram, now, failure):
    # The summaries used to be asked for group by group, each group written before the next
    # was summarized: a model failing on the second group left the first consolidated (its
    # originals archived) and raised, so the caller saw an error but the file had changed.
    ids = _memories(tmp_engram, now, n_per_topic=2)
    calls = []

    def summarizer(texts):
        calls.append(texts)
        if len(calls) == 2:
            if failure == "raises":
                raise RuntimeError("the model is down")
            return "x" * (MAX_CONTENT_BYTES + 1) if failure == "too long" else ""
        return "a summary"

    with pytest.raises(ValidationError):  # a model that raises too (its exception the cause, since session 11)
        consolidate_sleep(tmp_engram, threshold=10, target=5, summarizer=summarizer, now=now)
    assert len(calls) == 2
    assert all(tmp_engram.get(i).tier == "hot" for i in ids)
    assert [n.id for n in tmp_engram.scan() if "core" in n.tags] == []
    report = consolidate_sleep(tmp_engram, threshold=10, target=5, summarizer=lambda texts: "ok", now=now)
    assert report.archived == 10 and unconsolidated(tmp_engram) == []


def test_a_summary_holding_a_lone_surrogate_is_stored_with_a_replacement_character(tmp_engram, now):
    # a model's output with half an escaped surrogate pair: the second group's core could not be
    # encoded, after the first group's core was written and its members archived
    ids = _memories(tmp_engram, now, n_per_topic=2)
    calls = []

    def summarizer(texts):
        calls.append(texts)
        return "a summary \ud83d" if len(calls) == 2 else "a summary"

    report = consolidate_sleep(tmp_engram, threshold=10, target=5, summarizer=summarizer, now=now)
    assert report.archived == len(ids) == 10 and unconsolidated(tmp_engram) == []
    contents = sorted(core["content"] for core in report.cores)
    assert contents.count("a summary \ufffd") == 1
    assert sorted(n.content for n in tmp_engram.scan(tags=["core"])) == contents


def test_tags_given_as_one_string_are_refused(tmp_engram, now):
    # tags="garden" was read as the tags g, a, r, d, e, n: no memory carried them all, so the
    # run silently found nothing to consolidate
    _memories(tmp_engram, now, n_per_topic=2)
    with pytest.raises(ValidationError, match="tags"):
        consolidate_sleep(tmp_engram, threshold=2, tags="garden", now=now)
    with pytest.raises(ValidationError, match="tags"):
        unconsolidated(tmp_engram, tags="garden")


def test_a_forced_run_with_one_candidate_says_it_needs_two(tmp_engram, now):
    # it said "sleep consolidation runs at 50": with force it runs at 2, the reason it did not
    tmp_engram.remember("a lone memory", now=now)
    report = consolidate_sleep(tmp_engram, threshold=50, force=True, now=now)
    assert report.skipped == "1 unconsolidated memories; a forced sleep consolidation needs at least 2"


def test_a_run_interrupted_while_archiving_is_finished_by_the_next_one(tmp_engram, now):
    # Before session 8 a run wrote the core, its edges and each archive apart, so it could
    # stop between them; the next run grouped the members left live with the others and gave
    # them a second core memory (their content twice in recall). Such a core (no "complete"
    # mark) still gets its live members archived under it, and the rest is consolidated.
    ids = _memories(tmp_engram, now, n_per_topic=4)
    members = ["garden-0", "garden-1", "garden-2", "garden-3"]
    tmp_engram.remember("Alice waters the tomato garden.", id="core-old", now=now, tags=["agent", "core"],
                        metadata={"agent": {"kind": "core", "consolidated_from": members, "at": now}})
    for member in members:
        tmp_engram.link("core-old", member, "derived_from", now=now)
    tmp_engram.archive("garden-0", now=now)
    tmp_engram.archive("garden-1", now=now)  # stopped here: garden-2 and garden-3 left live
    report = consolidate_sleep(tmp_engram, threshold=10, now=now)
    assert report.cores[0] == {"id": "core-old", "derived_from": ["garden-2", "garden-3"],
                               "content": "Alice waters the tomato garden.", "resumed": True}
    assert report.archived == len(ids) - 2 and unconsolidated(tmp_engram) == []
    cores = [n for n in tmp_engram.scan() if "core" in n.tags]
    owners = {}
    for core in cores:
        for edge in tmp_engram.edges(core.id):
            if edge.kind == "derived_from":
                owners.setdefault(edge.dst, []).append(core.id)
    assert sorted(owners) == sorted(ids) and all(len(o) == 1 for o in owners.values())  # one core each
    assert sorted(i for i, o in owners.items() if o == ["core-old"]) == members
    assert all(tmp_engram.get(i).tier == "archive" for i in ids)


def test_a_run_stopped_while_writing_a_core_leaves_nothing_of_it(tmp_engram, now, monkeypatch):
    # the core memory, its edges and the archiving are one commit
    from engramdb.engram import Transaction

    ids = _memories(tmp_engram, now, n_per_topic=4)
    real_archive = Transaction.archive
    calls = []

    def crash_on_the_third(self, id, **kwargs):
        calls.append(id)
        if len(calls) == 3:
            raise KeyboardInterrupt("the process was killed")
        return real_archive(self, id, **kwargs)

    monkeypatch.setattr(Transaction, "archive", crash_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        consolidate_sleep(tmp_engram, threshold=10, now=now)
    monkeypatch.setattr(Transaction, "archive", real_archive)
    assert [n for n in tmp_engram.scan() if "core" in n.tags] == []
    assert sorted(n.id for n in unconsolidated(tmp_engram)) == sorted(ids)
    report = consolidate_sleep(tmp_engram, threshold=10, now=now)
    assert report.archived == len(ids) and unconsolidated(tmp_engram) == []


def test_a_member_the_user_unarchives_stays_live(tmp_engram, now):
    # the next run took a live member of a completed core for one an interrupted run had
    # left, and archived it again: unarchive did not stick
    _memories(tmp_engram, now, n_per_topic=4)
    consolidate_sleep(tmp_engram, threshold=10, now=now)
    tmp_engram.unarchive("garden-0")
    assert "garden-0" not in [n.id for n in unconsolidated(tmp_engram)]  # it has its core memory
    for k in range(12):
        tmp_engram.remember(f"The kitchen table number {k} needs a new coat of oil.", id=f"new-{k}", now=now + 50)
    report = consolidate_sleep(tmp_engram, threshold=10, now=now + 100)
    assert report.archived == 12 and not any(core.get("resumed") for core in report.cores)
    assert tmp_engram.get("garden-0").tier != "archive"
    assert all(tmp_engram.get(f"new-{k}").tier == "archive" for k in range(12))


def test_a_core_another_run_wrote_meanwhile_is_left_to_it(tmp_engram, now):
    # two runs at once (two processes, or two MCP after_task calls at the threshold): the
    # second checked for its core memory before the first wrote it, then raised
    # DuplicateIdError from after_task
    _memories(tmp_engram, now, n_per_topic=4)
    before = list(tmp_engram.scan())

    class LateRun:
        """The second run: it read the candidates before the first run wrote anything."""

        def __getattr__(self, name):
            return getattr(tmp_engram, name)

        def __contains__(self, id):
            return not id.startswith("core-") and id in tmp_engram

        def scan(self, *, tags=None, tiers=None):
            return iter([n for n in before if set(tags or ()) <= set(n.tags)])

    first = consolidate_sleep(tmp_engram, threshold=10, now=now)
    rows = sorted(n.id for n in tmp_engram.scan())
    late = consolidate_sleep(LateRun(), threshold=10, now=now)
    assert late.cores == [] and late.archived == 0
    assert sorted(n.id for n in tmp_engram.scan()) == rows and first.archived == 20


def test_a_summarizer_that_cannot_be_called_is_refused_before_anything_is_written(tmp_engram, now):
    # consolidate_sleep(summarizer=5) raised a bare TypeError "'int' object is not callable"
    _memories(tmp_engram, now, n_per_topic=2)
    with pytest.raises(ValidationError, match="summarizer"):
        consolidate_sleep(tmp_engram, threshold=2, summarizer=5, now=now)
    assert len(unconsolidated(tmp_engram)) == 10


def test_a_core_memory_is_about_700_characters_even_from_one_long_sentence(tmp_engram, now):
    # the first sentence chosen was taken whole: a member that is one long sentence (a note
    # without stops, a pasted log line) became a core memory as long as itself
    words = " ".join(f"word{k}" for k in range(3000))
    tmp_engram.remember("Deploy notes " + words, id="long", now=now)
    tmp_engram.remember("Deploy notes are short here.", id="short", now=now)
    report = consolidate_sleep(tmp_engram, threshold=2, target=1, now=now)
    [core] = report.cores
    assert len(core["content"]) <= 700 + 1
    assert core["content"].startswith("Deploy notes word0 word1") and core["content"].endswith("…")
    assert tmp_engram.get("long", full=True).content == "Deploy notes " + words  # the original is kept whole


def test_numpy_ints_are_taken_and_bools_refused(tmp_engram, now):
    # NumPy's ints (a pandas or numpy config) were refused as "must be an int", while top_k took
    # them; target=True was taken as 1
    _memories(tmp_engram, now, n_per_topic=2)
    report = consolidate_sleep(tmp_engram, threshold=np.int64(10), target=np.int32(5), now=now)
    assert report.archived == 10 and report.threshold == 10 and type(report.threshold) is int
    for bad in ({"target": True}, {"threshold": True}, {"threshold": 10.0}, {"target": np.float64(2)}):
        with pytest.raises(ValidationError, match="must be"):
            consolidate_sleep(tmp_engram, now=now, **bad)
    hooks = MemoryHooks(tmp_engram, sleep_threshold=np.int64(30))
    assert hooks.sleep_threshold == 30 and type(hooks.sleep_threshold) is int
    with pytest.raises(ValidationError, match="sleep_threshold"):
        MemoryHooks(tmp_engram, sleep_threshold=True)
    graph = ProceduralGraph(tmp_engram, min_trajectories=np.int64(3))
    assert graph.min_trajectories == 3 and graph.guidance_for("x", max_steps=np.int64(2)) == ""
    with pytest.raises(ValidationError, match="max_steps"):
        graph.guidance_for("x", max_steps=True)


def test_a_run_whose_members_another_run_consolidated_meanwhile_leaves_them_to_it(tmp_engram, now):
    # two runs at once that grouped differently (another target, or one more fact seen: two
    # agents, or two MCP after_task calls at the threshold; a summarizer that is a model call
    # makes the window seconds long): the later commits wrote a second core memory over
    # members the first had archived, so one fact was in two core memories
    _memories(tmp_engram, now, n_per_topic=4)
    other: list = []

    def summarizer(texts):
        if not other:  # meanwhile, another run consolidates the same memories its own way
            other.append(consolidate_sleep(tmp_engram, threshold=10, target=2, now=now + 1))
        return "Summary: " + " ".join(t.split(" ")[0] for t in texts)

    late = consolidate_sleep(tmp_engram, threshold=10, target=5, summarizer=summarizer, now=now + 2)
    first = other[0]
    assert first.archived == 20 and len(first.cores) == 2
    cores = list(tmp_engram.scan(tags=["core"]))
    members = [m for core in cores for m in core.metadata["agent"]["consolidated_from"]]
    assert sorted(members) == sorted(n for n in _memory_ids()) and len(members) == 20  # each in one core
    assert sorted(c.id for c in cores) == sorted(c["id"] for c in first.cores)
    assert late.cores == [] and late.archived == 0  # nothing claimed that it did not write
    for core in cores:  # and each core linked to its own members only
        derived = sorted(e.dst for e in tmp_engram.edges(core.id) if e.kind == "derived_from")
        assert derived == sorted(core.metadata["agent"]["consolidated_from"])


def test_a_group_whose_member_was_changed_or_forgotten_meanwhile_is_left_for_the_next_run(tmp_engram, now):
    # a member forgotten while the summarizer ran made the run raise NotFoundError after
    # earlier groups were written; one edited meanwhile was archived under a summary of its
    # old text
    _memories(tmp_engram, now, n_per_topic=4)
    calls: list = []

    def summarizer(texts):
        calls.append(texts)
        if len(calls) == 1:
            tmp_engram.forget(ids=["garden-1"])
            tmp_engram.update("deploy-2", content="The deploy pipeline moved to the new cluster.")
        return "Summary of " + str(len(texts))

    report = consolidate_sleep(tmp_engram, threshold=10, summarizer=summarizer, now=now)
    written = {m for core in report.cores for m in core["derived_from"]}
    assert "garden-1" not in written and "deploy-2" not in written and report.archived == len(written) > 0
    assert tmp_engram.get("deploy-2").tier != "archive"
    assert not any(m.startswith(("garden-", "deploy-")) for m in written)  # those groups wait, whole
    again = consolidate_sleep(tmp_engram, threshold=2, now=now + 10)
    assert "deploy-2" in {m for core in again.cores for m in core["derived_from"]}


def _memory_ids():
    return [f"{topic}-{k}" for topic in TOPICS for k in range(4)]


def test_a_summarizer_that_raises_is_a_validation_error_and_nothing_is_written(tmp_engram, now):
    # the model's exception (an API timeout on the second group here) left consolidate_sleep
    # raw; a blank summary was "the summarizer returned str, not text"
    _memories(tmp_engram, now, n_per_topic=2)
    calls: list = []

    def summarizer(texts):
        calls.append(texts)
        if len(calls) == 2:
            raise TimeoutError("the model did not answer")
        return "A summary."

    with pytest.raises(ValidationError, match="the summarizer raised TimeoutError: the model did not answer") as info:
        consolidate_sleep(tmp_engram, threshold=10, summarizer=summarizer, now=now)
    assert isinstance(info.value.__cause__, TimeoutError) and "nothing of what it was called for was written" in info.value.hint
    assert len(unconsolidated(tmp_engram)) == 10 and list(tmp_engram.scan(tags=["core"])) == []
    with pytest.raises(ValidationError, match="the summarizer returned an empty text"):
        consolidate_sleep(tmp_engram, threshold=10, summarizer=lambda texts: " \n", now=now)


def test_copies_of_a_memory_as_near_to_two_groups_join_the_same_one():
    """Memories outside the clusters join the group whose centroid is nearest; BLAS
    (``vectors @ centroids.T``) scored copies of one vector an ulp apart by their row, so
    copies as near to two groups were split between them (here 8 of 60 such spaces at the
    built-in 512 dims). Each pair is now computed as recall computes it (row_dots)."""
    from engramdb.agent import consolidate as mod
    from engramdb.index.vectors import row_dots

    for seed in (4, 5, 7, 12, 21):
        rng = np.random.default_rng(seed)
        a, b = mod._unit(rng.standard_normal((2, 512)).astype(np.float32))
        x = mod._unit((a + b)[None])[0]  # the copies: as near to a as to b (cosine ~0.7, no cluster with them)
        vectors = np.vstack([a, a, b, b] + [x] * 7).astype(np.float32)
        groups = mod._groups([f"m{i}" for i in range(len(vectors))], vectors, 2)
        assert sorted(len(g) for g in groups) == [2, 9], seed  # clusters {a, a} and {b, b}; the copies together
        centroids = mod._centroids(vectors, [[0, 1], [2, 3]])
        sims = mod._sims(vectors[4:], centroids)
        assert all(np.array_equal(sims[:, k], row_dots(vectors[4:], centroids[k])) for k in range(2))
