"""Before/after-task hooks: recall what matters before a task, form facts after it.

    hooks = MemoryHooks(db)
    prompt = hooks.before_task(task) + "\\n\\n" + task      # "" when nothing is relevant
    messages = run_agent(prompt)                            # the user's own loop and model
    hooks.after_task(messages, outcome="success")           # 1 to 3 new facts, deduplicated

Works on an ``Engram`` through its public API (duck-typed). Semantics: spec/agent.md section 2.
"""
from __future__ import annotations

import hashlib
import json
import threading
from typing import Any
from collections.abc import Callable, Iterable, Mapping, Sequence

from ..errors import DuplicateIdError, EngramError, ValidationError
from ..recall import Hit, as_int, as_real
from ..records import MAX_CONTENT_BYTES, now_ts
from ..tokens import token_counter
from .consolidate import LIVE_TIERS, SleepReport, Summarizer, _check_summarizer, consolidate_sleep, live_candidates
from .extract import Fact, extract_facts
from .models import call_model, iterate_model
from .protocols import AgentMemory
from .procedures import OUTCOMES, ProceduralGraph
from .serialize import SerializedConversation, serialize_conversation
from .text import content_words, figures, negations, overlap, scrub, storable

__all__ = ["MemoryHooks", "Extractor", "HEADER", "DEFAULT_MIN_RELEVANCE"]

HEADER = "## Relevant Memories"
DEFAULT_MIN_RELEVANCE = 0.15
DUPLICATE_OVERLAP = 0.8
MAX_FACTS = 3
_EXTRACTOR_HINT = "return e.g. ['The user wants only the standard library']"
Extractor = Callable[[str], Iterable[str]]


def _render(lines: Sequence[str], guidance: str) -> str:
    """before_task's text: the memories' lines numbered under the header, then the guidance."""
    blocks = []
    if lines:
        blocks.append("\n".join([HEADER, *(f"{n}. {line}" for n, line in enumerate(lines, 1))]))
    if guidance:
        blocks.append(guidance)
    return "\n\n".join(blocks)


def _fact_id(fact: Fact) -> str:
    return "fact-" + hashlib.sha256(fact.text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _says_the_same(text: str, other: str) -> bool:
    """Whether ``text`` repeats the memory ``other``: most of its content words, the same
    negations ("not" is no content word: "Do not use X" after "Use X" is a new preference) and
    the same figures ("port 9090" after "port 8080", one word of eight, is a changed one)."""
    return overlap(content_words(text), content_words(other)) >= DUPLICATE_OVERLAP and \
        negations(other) == negations(text) and figures(other) == figures(text)


class MemoryHooks:
    """Memory around an agent loop, on one open file.

    Args:
        db: an open ``Engram``.
        extractor: ``text -> list of fact strings`` (the user's LLM prompt); without one,
            the deterministic extractor (spec/agent.md 2.2).
        top_k: at most this many memories in :meth:`before_task`.
        min_relevance: memories whose ``hit.relevance`` is below this are left out.
        procedures: keep a procedural graph: :meth:`after_task` records each trajectory
            with an outcome, and :meth:`before_task` appends the guidance for the task.
        sleep_threshold: :meth:`after_task` runs :meth:`consolidate_sleep` once this many
            unconsolidated memories carrying every tag in ``tags`` exist (None: never by itself).
        summarizer: ``list of texts -> one text``, for sleep consolidation.
        tags: tags every formed fact carries (plus ``fact`` and its kind); sleep
            consolidation takes only memories carrying them, so attaching hooks to a store
            of the user's own memories never archives those (empty: every memory).
    """

    def __init__(self, db: AgentMemory, *, extractor: Extractor | None = None, top_k: int = 5,
                 min_relevance: float = DEFAULT_MIN_RELEVANCE, procedures: bool = True,
                 sleep_threshold: int | None = 50, summarizer: Summarizer | None = None,
                 tags: Sequence[str] = ("agent",)) -> None:
        top, floor = as_int(top_k), as_real(min_relevance)  # NumPy's numbers too (a pandas row)
        if top is None or top < 1:
            raise ValidationError("top_k must be a positive int")
        if floor is None or not 0.0 <= floor <= 1.0:
            raise ValidationError("min_relevance must be a number between 0 and 1 (hit.relevance's range)")
        top_k, min_relevance = top, floor
        if isinstance(tags, (str, bytes)) or not isinstance(tags, Iterable):
            raise ValidationError("tags must be a list of tags, not a single string", hint='e.g. tags=["agent"]')
        tags = list(tags)
        if not all(isinstance(tag, str) for tag in tags):
            raise ValidationError("tags must be strings", hint='e.g. tags=["agent"]')
        if any(not tag.strip() for tag in tags):  # refused by the first fact's write otherwise, task after task
            raise ValidationError(f"tags must not be empty or blank, got {tags!r}", hint="leave the empty tag out")
        if sleep_threshold is not None:
            every = as_int(sleep_threshold)  # NumPy's ints too; never a bool
            if every is None or every < 2:
                raise ValidationError(f"sleep_threshold must be an int of at least 2, or None, got {sleep_threshold!r}")
            sleep_threshold = every
        if extractor is not None and not callable(extractor):
            raise ValidationError(f"the extractor must be a callable or None, got a {type(extractor).__name__}",
                                  hint="pass a function text -> list of fact strings, or None for the built-in one")
        _check_summarizer(summarizer)
        self.db = db
        self.extractor = extractor
        self.top_k = top_k
        self.min_relevance = min_relevance
        self.graph = ProceduralGraph(db) if procedures else None
        self.sleep_threshold = sleep_threshold
        self.summarizer = summarizer
        self.tags = list(tags)
        self._sleeping = threading.Lock()  # held by the after_task that runs a sleep consolidation

    # -- before ---------------------------------------------------------------------------
    def relevant(self, task_text: str) -> list[Hit]:
        """The recall hits for ``task_text`` at or above the relevance floor, best first
        (live memories only: archived originals are represented by their core memory)."""
        if not isinstance(task_text, str):
            raise ValidationError("before_task() takes the task's text")
        if not task_text.strip():
            return []
        hits: list[Hit] = self.db.recall(task_text, top_k=self.top_k, tiers=list(LIVE_TIERS),
                                         min_relevance=self.min_relevance)
        return hits

    def before_task(self, task_text: str, *, max_tokens: int | None = None,
                    count_tokens: Callable[[str], int] | None = None) -> str:
        """The memories relevant to ``task_text`` as a numbered block headed ``## Relevant
        Memories`` (and the procedure that worked for similar tasks, when there is one), or
        "" when nothing is relevant: unrelated memories make an agent worse.

        ``max_tokens`` (None: no budget) is a hard limit on the text returned, measured whole
        under ``count_tokens`` (default :func:`engramdb.estimate_tokens`), as recall_context's
        budget is. Each memory is whole or left out, never cut: best first, a memory goes in
        when the text with it still fits (a later, shorter one may fit after one that did
        not), then the procedure block, whole, when it still fits.

        Raises:
            ValidationError: ``task_text`` is not a string, ``max_tokens`` is not a
                non-negative int or None, or ``count_tokens`` fails.
        """
        budget = None
        if max_tokens is not None:
            budget = as_int(max_tokens)
            if budget is None or budget < 0:
                raise ValidationError(f"max_tokens must be a non-negative int or None, got {max_tokens!r}",
                                      hint="e.g. max_tokens=800, or leave it out for no budget")
        count = token_counter(count_tokens)
        hits = self.relevant(task_text)
        lines = [' '.join(hit.node.content.split()) for hit in hits]
        guidance = self.graph.guidance_for(task_text) if self.graph is not None else ""
        if budget is None:
            return _render(lines, guidance)
        kept: list[str] = []
        for line in lines:
            if count(_render([*kept, line], "")) <= budget:
                kept.append(line)
        if guidance and count(_render(kept, guidance)) <= budget:
            return _render(kept, guidance)
        return _render(kept, "")  # measured when its last line went in ("" when none did)

    # -- after ----------------------------------------------------------------------------
    def _facts(self, conv: SerializedConversation, outcome: str | None) -> list[Fact]:
        """The facts to store, all checked before the first is written (a fact refused by its
        write would leave the ones before it stored, and the trajectory unrecorded)."""
        if self.extractor is None:
            return extract_facts(conv, outcome=outcome)
        produced = call_model(self.extractor, conv.text, "extractor")
        # a Mapping (a model's {"facts": [...]} parsed) would iterate its keys as facts
        if isinstance(produced, (str, bytes, Mapping)) or not isinstance(produced, Iterable):
            raise ValidationError(f"the extractor returned a {type(produced).__name__}; it must return a list "
                                  "of fact strings", hint=_EXTRACTOR_HINT)
        facts: list[Fact] = []
        for item in iterate_model(produced, "extractor"):
            if not isinstance(item, str):
                raise ValidationError(f"the extractor returned a {type(item).__name__} among its facts; "
                                      "each fact must be a string", hint=_EXTRACTOR_HINT)
            text = scrub(item)
            if len(text) > MAX_CONTENT_BYTES:
                raise ValidationError(f"the extractor returned a fact of {len(text)} characters; a memory holds at "
                                      f"most {MAX_CONTENT_BYTES}", hint="return facts of a sentence or two each, "
                                                                         "not the transcript")
            if text:
                facts.append(Fact(text, "extracted"))
                if len(facts) == MAX_FACTS:  # the rest is not read (a generator may not end)
                    break
        return facts

    def _is_duplicate(self, text: str) -> bool:
        return any(_says_the_same(text, hit.node.content) for hit in self.db.recall(text, top_k=3, tiers=list(LIVE_TIERS)))

    def _last_commit(self) -> int | None:
        """The store's last committed transaction id (any process's), or None when this
        AgentMemory does not tell it."""
        last = getattr(getattr(self.db, "_store", None), "last_txnid", None)
        return last() if callable(last) else None

    def after_task(self, messages: Iterable[Any] | SerializedConversation, *, outcome: str | None = None,
                   session: str | None = None, now: float | None = None) -> list[str]:
        """Serialize the trajectory and store 1 to 3 new facts from it; returns their ids.

        Facts carry provenance in ``metadata["agent"]`` (session, time, tool sequence,
        outcome, kind) and are left out when a stored memory already says the same. With an
        ``outcome`` (``success`` / ``failure``) the trajectory is also recorded in the
        procedural graph. Once :attr:`sleep_threshold` unconsolidated memories exist, sleep
        consolidation runs.

        Raises:
            ValidationError: a transcript that cannot be parsed (the message and field are
                named), a bad outcome, or an extractor that raises (its exception is the
                cause), returns something else than strings or a fact longer than a memory
                holds; nothing is written then.
            EngramError: the sleep consolidation this call ran failed (a summarizer that
                raises: ValidationError); the message says that the facts (their ids) and the
                trajectory were stored before it.
        """
        if outcome is not None and outcome not in OUTCOMES:
            raise ValidationError(f"outcome must be one of {', '.join(OUTCOMES)} or None, got {outcome!r}",
                                  hint="pass 'success' or 'failure', or no outcome when it is not known")
        if session is not None and not isinstance(session, str):
            raise ValidationError(f"session must be a string or None, got a {type(session).__name__}",
                                  hint="e.g. session='2024-05-02-a', or leave it out for a hash of the transcript")
        conv = serialize_conversation(messages)
        stamp = now_ts(now)
        session = session or "s-" + hashlib.sha256(conv.text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        facts = self._facts(conv, outcome)  # a model call: before the write transaction
        # The duplicate check and the writes in one write transaction: another thread (the MCP
        # server calls its tools in worker threads) or process saying the same thing at once
        # waits for it and then finds these facts, instead of storing its own copy.
        # The recalls of the duplicate check run first, outside it: inside a write transaction a
        # recall reads every index uncached (a space's whole vector matrix decoded from its blocks:
        # 20-50 ms instead of 3 at 20k memories), with the writer lock held. Their answers stand
        # when no commit came in between (then the transaction starts from what they read).
        before = self._last_commit()
        # (a fact already stored under its id needs no recall: the transaction skips it, or, gone
        # meanwhile, sees another commit and checks it again)
        fresh = None if before is None else \
            [_fact_id(f) not in self.db and not self._is_duplicate(f.text) for f in facts]
        with self.db.transaction():
            if fresh is not None and self._last_commit() != before:
                fresh = None  # another write came in between: check again, inside
            ids = self._store(conv, facts, outcome, session, stamp, fresh)
        # live_candidates >= unconsolidated: below the threshold there, no need to read the cores.
        # Outside the transaction (a summarizer may take seconds; each group commits alone), and
        # skipped while another thread's after_task consolidates (its groups would only be stale).
        if self.sleep_threshold is not None and len(live_candidates(self.db, tags=self.tags)) >= self.sleep_threshold \
                and self._sleeping.acquire(blocking=False):
            try:
                self.consolidate_sleep(now=stamp)
            except EngramError as exc:
                # this task's facts and trajectory are stored: a caller told only "the summarizer
                # raised" would take the task as not done, and the new facts' ids were lost
                stored = ", ".join(ids) if ids else "no new fact"
                exc.message = (f"after_task stored this task's facts ({stored}) and its trajectory, then sleep "
                               f"consolidation failed: {exc.message}")
                exc.args = (exc.message,)
                raise
            finally:
                self._sleeping.release()
        return ids

    def _store(self, conv: SerializedConversation, facts: list[Fact], outcome: str | None, session: str,
               stamp: float, fresh: list[bool] | None = None) -> list[str]:
        """Store the facts that say something new, in the caller's write transaction.
        ``fresh``: per fact, the duplicate check's answer from the state this transaction
        starts from (None: check here); a fact is also compared with this call's earlier ones."""
        ids: list[str] = []
        seen: set[str] = set()
        stored: list[str] = []
        for k, fact in enumerate(facts):
            fact_id = _fact_id(fact)
            if fact_id in seen or fact_id in self.db:
                continue
            # this call's earlier facts are compared directly: a recall in the transaction does
            # not see them (its index changes are applied at its end)
            new = fresh[k] if fresh is not None else not self._is_duplicate(fact.text)
            if not new or any(_says_the_same(fact.text, text) for text in stored):
                continue
            seen.add(fact_id)
            provenance = {"session": session, "at": stamp, "tool_sequence": [storable(t) for t in conv.tool_sequence],
                          "outcome": outcome, "kind": fact.kind, "had_errors": conv.has_errors}
            try:
                ids.append(self.db.remember(fact.text, id=fact_id, now=stamp, tags=[*self.tags, "fact", fact.kind],
                                            importance=0.7, metadata={"agent": provenance}))
                stored.append(fact.text)
            except DuplicateIdError:  # another process stored the same fact since the check
                continue
        if self.graph is not None and outcome is not None:
            # the same transcript, outcome and session is a retry of this call, not another run
            call = json.dumps([conv.text, outcome, session], ensure_ascii=True)
            self.graph.record_trajectory(conv, outcome, now=stamp,
                                         call_id="after_task-" + hashlib.sha256(call.encode()).hexdigest()[:24])
        return ids

    # -- sleep ----------------------------------------------------------------------------
    def consolidate_sleep(self, *, force: bool = False, now: float | None = None) -> SleepReport:
        """:func:`engramdb.agent.consolidate_sleep` with this object's threshold, summarizer and
        tags (only the memories carrying every one of :attr:`tags`)."""
        return consolidate_sleep(self.db, threshold=self.sleep_threshold or 50, summarizer=self.summarizer,
                                 tags=self.tags or None, force=force, now=now)
