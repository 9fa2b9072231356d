"""The procedural graph: what an agent learned about *how* to do things, kept in the file.

Nodes are actions (tools), reasoning steps or states (``start``, ``end``); edges are
``leads_to``, ``requires``, ``enables``, ``alternative_to``, ``fallback_for`` and
``verifies``, each with a condition, guidance, pitfalls and success/failure counts.
Trajectories are recorded as they come; once enough are recorded, :meth:`refine`
contrasts successes with failures, proposes edits (through a callable, or by counting
which tool transitions separate them), validates each on held-out trajectories, applies
those that help and remembers every decided proposal so it is not proposed again.

Everything lives in the ``procedures`` table as rows (spec/agent.md section 4), so it is
sealed like the rest of the file and round-trips through dumps. This module works on an
``Engram`` through its public API only (``procedure_rows``, ``transaction`` and the
transaction's procedure-row methods). A graph object keeps the rows it parsed by key (a key is
a keyed hash of its row's content), so recording a trajectory reads only the rows new to it.
"""
from __future__ import annotations

import hashlib
import json
import operator
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Iterable, Mapping

from .. import codec
from ..errors import ValidationError
from ..recall import as_int
from ..records import MAX_CONTENT_BYTES, now_ts
from .models import call_model, iterate_model
from .protocols import AgentMemory, AgentTransaction
from .serialize import SerializedConversation, serialize_conversation
from .text import content_words, overlap, scrub, storable
import itertools

__all__ = [
    "RELATIONS", "NODE_KINDS", "OUTCOMES", "ProcedureNode", "ProcedureEdge", "Trajectory", "Proposal",
    "RefineReport", "ProceduralGraph", "Proposer",
]

RELATIONS = ("leads_to", "requires", "enables", "alternative_to", "fallback_for", "verifies")
NODE_KINDS = ("action", "reasoning", "state")
OUTCOMES = ("success", "failure")
OPS = ("add_pitfall", "add_guidance", "add_edge")
START, END = "start", "end"
# A tool's node id is its name, except a name that is a state's id, or such a name already behind
# one or more "tool:" (tool "start" is "tool:start", tool "tool:start" is "tool:tool:start"): ids
# stay one per name and apart from the states, and every other name keeps the id older
# versions gave it, so their files read the same.
_TOOL_ESCAPE = "tool:"
_ESCAPED = re.compile(r"(?:tool:)*(?:start|end)")
_VERIFIERS = ("test", "pytest", "unittest", "check", "verify", "lint", "mypy", "ruff")
_MAX_TASK = 300
# A proposer is a model: an endless generator hung refine, and a 17 MB text was stored twice (the edge and
# the proposal row). At most this many proposals are read, each string at most a memory's limit
# (as a summarizer's core memory, spec/agent.md 4.3).
MAX_PROPOSALS = 1000
MAX_PROPOSAL_TEXT = MAX_CONTENT_BYTES

Proposer = Callable[[Mapping[str, Any]], Iterable[Mapping[str, Any]]]


@dataclass(frozen=True)
class ProcedureNode:
    """An action (a tool), a reasoning step or a state."""

    id: str
    kind: str = "action"
    label: str = ""

    def row(self) -> dict[str, Any]:
        return {"row": "node", "id": self.id, "kind": self.kind, "label": self.label}


@dataclass(frozen=True)
class ProcedureEdge:
    """A typed edge with what was learned about it."""

    src: str
    dst: str
    relation: str = "leads_to"
    condition: str = ""
    guidance: str = ""
    pitfalls: tuple[str, ...] = ()
    success: int = 0
    failure: int = 0

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.src, self.dst, self.relation)

    def row(self) -> dict[str, Any]:
        return {"row": "edge", "src": self.src, "dst": self.dst, "relation": self.relation,
                "condition": self.condition, "guidance": self.guidance, "pitfalls": list(self.pitfalls),
                "success": self.success, "failure": self.failure}


@dataclass(frozen=True)
class Trajectory:
    """One recorded trajectory: its tool calls in order, which failed, the outcome and the task."""

    id: str
    seq: int
    tools: tuple[str, ...]
    errors: tuple[int, ...]
    outcome: str
    task: str
    at: float
    call: str = ""  # the recording call's identity (record_trajectory's call_id); "" when none

    @property
    def transitions(self) -> set[tuple[str, str]]:
        return set(itertools.pairwise(_path(self.tools)))

    def row(self) -> dict[str, Any]:
        row = {"row": "trajectory", "id": self.id, "seq": self.seq, "tools": list(self.tools),
               "errors": list(self.errors), "outcome": self.outcome, "task": self.task, "at": self.at}
        if self.call:  # only then: a row recorded without one keeps the bytes (and key) it had
            row["call"] = self.call
        return row


@dataclass(frozen=True)
class Proposal:
    """A proposed graph edit: a pitfall or guidance on the transition ``src -> dst``, or a new edge.

    A pitfall claims that trajectories taking the transition fail; guidance and a new
    edge claim that they succeed. That claim is what held-out trajectories test.
    """

    op: str
    src: str
    dst: str
    relation: str = "leads_to"
    text: str = ""
    condition: str = ""

    @property
    def key(self) -> str:
        """The identity remembered once decided: the op and the edge, not the wording."""
        return f"{self.op}|{self.src}|{self.dst}|{self.relation}"

    @property
    def predicts(self) -> str:
        return "failure" if self.op == "add_pitfall" else "success"

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "src": self.src, "dst": self.dst, "relation": self.relation, "text": self.text,
                "condition": self.condition}

    @classmethod
    def parse(cls, data: Any, n: int) -> Proposal:
        """A proposal from a proposer's mapping.

        Raises:
            ValidationError: a missing or malformed field, named with the proposal's index.
        """
        hint = ("return mappings like {'op': 'add_pitfall', 'src': 'edit_file', 'dst': 'run_tests', "
                "'text': 'run the linter first'}; op is one of " + ", ".join(OPS))
        if not isinstance(data, Mapping):
            raise ValidationError(f"proposal {n} is a {type(data).__name__}, not a mapping", hint=hint)
        values = {}
        for key, default in (("op", None), ("src", None), ("dst", None), ("relation", "leads_to"), ("text", ""),
                             ("condition", "")):
            value = data.get(key, default)
            if not isinstance(value, str) or (default is None and not value):
                raise ValidationError(f"proposal {n}: {key} must be a non-empty string" if default is None
                                      else f"proposal {n}: {key} must be a string", hint=hint)
            if len(value) > MAX_PROPOSAL_TEXT:
                raise ValidationError(f"the proposer's proposal {n}: {key} is {len(value)} characters, more than "
                                      f"{MAX_PROPOSAL_TEXT} (a memory's limit)",
                                      hint="make the proposer return short texts (a pitfall or guidance line); "
                                           "nothing was written")
            # a model's JSON may hold half an escaped surrogate pair: the file cannot encode it
            values[key] = storable(value)
        if values["op"] not in OPS:
            raise ValidationError(f"proposal {n}: op {values['op']!r} is not one of {', '.join(OPS)}", hint=hint)
        if values["relation"] not in RELATIONS:
            raise ValidationError(f"proposal {n}: relation {values['relation']!r} is not one of "
                                  f"{', '.join(RELATIONS)}", hint=hint)
        return cls(**values)


@dataclass
class RefineReport:
    """What :meth:`ProceduralGraph.refine` did."""

    trajectories: int
    skipped: str | None = None
    proposed: list[dict[str, Any]] = field(default_factory=list)
    applied: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    unvalidated: list[dict[str, Any]] = field(default_factory=list)
    already_decided: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"trajectories": self.trajectories, "skipped": self.skipped, "proposed": self.proposed,
                "applied": self.applied, "rejected": self.rejected, "unvalidated": self.unvalidated,
                "already_decided": self.already_decided}


_Parsed = tuple[Any, Any]  # (its "row" field, its object: a node, (edge, row), a trajectory, the proposal row, None)


def _parse(row: Any) -> _Parsed:
    """One procedure row as the object :class:`_Rows` keeps of it.

    Raises:
        ValidationError: a row of a known kind lacks a field or holds a wrong type.
    """
    if not isinstance(row, Mapping):
        raise ValidationError(f"a procedure row is a {type(row).__name__}, not a map",
                              hint="restore the file from a dump, or delete the row")
    kind = row.get("row")
    try:
        if kind == "node":
            return kind, ProcedureNode(row["id"], row["kind"], row.get("label", ""))
        if kind == "edge":
            return kind, (ProcedureEdge(row["src"], row["dst"], row["relation"], row.get("condition", ""),
                                        row.get("guidance", ""), tuple(row.get("pitfalls", ())),
                                        int(row.get("success", 0)), int(row.get("failure", 0))), row)
        if kind == "trajectory":
            return kind, Trajectory(row["id"], int(row["seq"]), tuple(row["tools"]), tuple(row.get("errors", ())),
                                    row["outcome"], row.get("task", ""), float(row.get("at", 0.0)),
                                    str(row.get("call", "")))
        if kind == "proposal":
            return kind, (row["key"], row)
    except (KeyError, TypeError, ValueError):
        raise ValidationError(f"a procedure row of kind {kind!r} is malformed: {sorted(row)}",
                              hint="restore the file from a dump, or delete the row") from None
    return kind, None


def _later(row: Mapping[str, Any], held: Mapping[str, Any]) -> bool:
    """Whether ``row`` sorts after ``held`` by its msgpack bytes."""
    return codec.pack(row) > codec.pack(held)


class _Rows:
    """The procedure rows of one snapshot, by kind (from the rows, or from their parsed forms
    in key order)."""

    def __init__(self, rows: Iterable[Mapping[str, Any]] = (), *, parsed: Iterable[_Parsed] = ()) -> None:
        self.nodes: dict[str, ProcedureNode] = {}
        self.edges: dict[tuple[str, str, str], ProcedureEdge] = {}
        self.edge_rows: dict[tuple[str, str, str], Mapping[str, Any]] = {}
        self.trajectories: list[Trajectory] = []
        self.decided: dict[str, Mapping[str, Any]] = {}
        # Two rows for one node, edge or proposal (written by hand: the graph replaces its own):
        # the one whose msgpack bytes sort last wins, whatever order the rows come in (value
        # order from procedure_rows, blind-key order from a transaction's keys).
        for kind, item in itertools.chain(map(_parse, rows), parsed):
            if kind == "node":
                held_node = self.nodes.get(item.id)
                if held_node is None or _later(item.row(), held_node.row()):
                    self.nodes[item.id] = item
            elif kind == "edge":
                edge, row = item
                held = self.edge_rows.get(edge.key)
                if held is None or _later(row, held):
                    self.edges[edge.key] = edge
                    self.edge_rows[edge.key] = row
            elif kind == "trajectory":
                self.trajectories.append(item)
            elif kind == "proposal":
                held = self.decided.get(item[0])
                if held is None or _later(item[1], held):
                    self.decided[item[0]] = item[1]
        self.trajectories.sort(key=operator.attrgetter("seq", "id"))  # ids break a tie in every store alike
        self._task_words: list[set[str]] | None = None

    def task_words(self) -> list[set[str]]:
        """The content words of each trajectory's task (computed once per rows object)."""
        if self._task_words is None:
            self._task_words = [content_words(t.task) for t in self.trajectories]
        return self._task_words


def node_id(tool: str) -> str:
    """The graph node id of the tool named ``tool``."""
    return _TOOL_ESCAPE + tool if _ESCAPED.fullmatch(tool) else tool


def tool_name(node: str) -> str:
    """The tool name of an action node id (inverse of :func:`node_id`)."""
    return node[len(_TOOL_ESCAPE):] if node.startswith(_TOOL_ESCAPE) and _ESCAPED.fullmatch(node) else node


def _path(tools: Iterable[str]) -> tuple[str, ...]:
    """The node ids a trajectory goes through: start, its tools', end."""
    return (START, *map(node_id, tools), END)


def _check_proposer(proposer: object) -> None:
    if proposer is not None and not callable(proposer):
        raise ValidationError(f"the proposer must be a callable or None, got a {type(proposer).__name__}",
                              hint="pass a function contrast -> list of proposals, or None to count transitions")


def _verifier(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _VERIFIERS)


class ProceduralGraph:
    """The procedural graph of one open file (see the module docstring and spec/agent.md).

    Args:
        db: an open ``Engram`` (used through ``procedure_rows`` and ``transaction``); keep one
            object per open file for the agent's life: it caches the rows it has parsed.
        min_trajectories: :meth:`refine` does nothing before this many trajectories.
        proposer: a callable ``contrast -> proposals`` (an LLM prompt, typically); without
            one, proposals come from counting tool transitions.
        holdout: the share of trajectories (of each outcome) held out to validate proposals.
        seed: picks the held-out trajectories, deterministically.
    """

    def __init__(self, db: AgentMemory, *, min_trajectories: int = 10, proposer: Proposer | None = None,
                 holdout: float = 1 / 3, seed: int = 0) -> None:
        least = as_int(min_trajectories)  # NumPy's ints too; never a bool
        if least is None or least < 2:
            raise ValidationError(f"min_trajectories must be an int of at least 2, got {min_trajectories!r}")
        min_trajectories = least
        if isinstance(holdout, bool) or not isinstance(holdout, (int, float)) or not 0 < holdout < 1:
            raise ValidationError("holdout must be between 0 and 1 (exclusive)")
        _check_proposer(proposer)
        self.db = db
        self.min_trajectories = min_trajectories
        self.proposer = proposer
        self.holdout = holdout
        self.seed = seed
        # every row this object parsed inside a transaction, by key (see _rows_in)
        self._parsed: dict[bytes, _Parsed] = {}
        # the rows read outside a transaction and the file's version they were read at (_rows)
        self._read: tuple[tuple[int, int] | None, _Rows | None] = (None, None)

    # -- reading ----------------------------------------------------------------------
    def _rows(self) -> _Rows:
        """The committed rows; read again only once the file moved on (any process's commit):
        repeated reads of an unchanged file (a guidance_for per task) decrypt nothing. The
        result is shared: never changed by its users."""
        since = getattr(self.db, "procedure_rows_since", None)
        if since is None:  # another AgentMemory
            return _Rows(self.db.procedure_rows())
        version, held = self._read
        now, rows = since(version)
        if rows is None and held is not None:
            return held
        fresh = _Rows(rows if rows is not None else self.db.procedure_rows())
        self._read = (now, fresh) if now is not None else (None, None)
        return fresh

    def _rows_in(self, tx: AgentTransaction) -> _Rows:
        """The rows ``tx`` sees, decrypting and parsing only those this object has not parsed
        before: recording one trajectory costs its own few rows, not the whole graph again.

        A row's key is a hash of its content, so a key parsed before holds the very same row
        now, whatever happened since (an aborted or enclosing transaction, another writer, a
        compaction): the cache is keyed by content, never by time or commit number. It keeps
        the keys ``tx`` lists, nothing else."""
        known = self._parsed
        current: dict[bytes, _Parsed] = {}
        for key in tx.procedure_keys():
            parsed = known.get(key)
            if parsed is None:
                row = tx.procedure_row(key)
                if row is None:  # listed by this same snapshot: cannot happen
                    continue
                parsed = _parse(row)
            current[key] = parsed
        self._parsed = current
        return _Rows(parsed=current.values())

    def nodes(self) -> list[ProcedureNode]:
        """Every node, sorted by id."""
        return sorted(self._rows().nodes.values(), key=lambda n: n.id)

    def edges(self) -> list[ProcedureEdge]:
        """Every edge, sorted by (src, dst, relation)."""
        return sorted(self._rows().edges.values(), key=lambda e: e.key)

    def trajectories(self) -> list[Trajectory]:
        """Every recorded trajectory, oldest first."""
        return list(self._rows().trajectories)

    def decided(self) -> dict[str, str]:
        """Every decided proposal key and its status (``applied`` or ``rejected``)."""
        return {key: row.get("status", "") for key, row in sorted(self._rows().decided.items())}

    def to_dict(self) -> dict[str, Any]:
        """The graph as JSON-ready data (what `engramdb agent procedures --json` prints)."""
        rows = self._rows()
        return {
            "nodes": [n.row() for n in sorted(rows.nodes.values(), key=lambda n: n.id)],
            "edges": [e.row() for e in sorted(rows.edges.values(), key=lambda e: e.key)],
            "trajectories": len(rows.trajectories),
            "outcomes": dict(sorted(Counter(t.outcome for t in rows.trajectories).items())),
            "decided": {key: dict(row) for key, row in sorted(rows.decided.items())},
        }

    # -- recording --------------------------------------------------------------------
    def record_trajectory(self, serialized: SerializedConversation | Iterable[Any], outcome: str, *,
                          task: str | None = None, now: float | None = None, call_id: str | None = None) -> str:
        """Keep one trajectory and count its transitions on the graph; returns its id.

        ``outcome`` is ``"success"`` or ``"failure"``. The task defaults to the first user
        prompt (environment noise removed, at most 300 characters). With a ``call_id`` the
        call is idempotent: when a trajectory recorded with that ``call_id`` is stored,
        nothing changes and its id is returned (a retried call counts its edges once).

        Raises:
            ValidationError: a bad outcome, or a transcript that cannot be parsed.
        """
        if outcome not in OUTCOMES:
            raise ValidationError(f"outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
        if call_id is not None and (not isinstance(call_id, str) or not call_id):
            raise ValidationError("call_id must be a non-empty string or None")
        call_key = storable(call_id or "")
        conv = serialize_conversation(serialized)
        calls = [call for turn in conv.turns for call in turn.tool_calls]
        tools = tuple(storable(call.name) for call in calls)
        errors = tuple(i for i, call in enumerate(calls) if call.is_error)
        if task is None:
            task = next((turn.user for turn in conv.turns if turn.user), "")
        elif not isinstance(task, str):
            raise ValidationError(f"task must be a string or None, got a {type(task).__name__}",
                                  hint="leave it out to take the first user prompt")
        task = scrub(task)[:_MAX_TASK]
        stamp = now_ts(now)

        with self.db.transaction() as tx:
            rows = self._rows_in(tx)
            if call_key:
                done = next((t for t in rows.trajectories if t.call == call_key), None)
                if done is not None:
                    return done.id
            seq = max((t.seq for t in rows.trajectories), default=0) + 1
            digest = hashlib.sha256(json.dumps([seq, tools, outcome, task]).encode()).hexdigest()[:12]
            trajectory = Trajectory(f"t{seq:06d}-{digest}", seq, tools, errors, outcome, task, stamp, call_key)
            tx.put_procedure_row(trajectory.row())
            for node in [ProcedureNode(START, "state", START), ProcedureNode(END, "state", END),
                         *(ProcedureNode(node_id(t), "action", t) for t in tools)]:
                if node.id not in rows.nodes:
                    rows.nodes[node.id] = node
                    tx.put_procedure_row(node.row())
            for edge_key in sorted(self._observed_edges(tools, errors)):
                old = rows.edges.get(edge_key, ProcedureEdge(*edge_key))
                new = ProcedureEdge(old.src, old.dst, old.relation, old.condition, old.guidance, old.pitfalls,
                                    old.success + (outcome == "success"), old.failure + (outcome == "failure"))
                self._replace_edge(tx, rows, old, new)
        return trajectory.id

    @staticmethod
    def _observed_edges(tools: tuple[str, ...], errors: tuple[int, ...]) -> set[tuple[str, str, str]]:
        """The edges one trajectory shows: ``leads_to`` for each transition; ``fallback_for``
        when a tool replaced one that failed; ``verifies`` when a test-like tool followed another."""
        path = _path(tools)
        observed = {(a, b, "leads_to") for a, b in itertools.pairwise(path)}
        failed = set(errors)
        for i in range(len(tools) - 1):
            a, b = path[i + 1], path[i + 2]
            if a == b:
                continue
            if i in failed and i + 1 not in failed:
                observed.add((b, a, "fallback_for"))
            if _verifier(tools[i + 1]) and not _verifier(tools[i]):
                observed.add((b, a, "verifies"))
        return observed

    @staticmethod
    def _replace_edge(tx: AgentTransaction, rows: _Rows, old: ProcedureEdge, new: ProcedureEdge) -> None:
        stored = rows.edge_rows.get(old.key)
        if stored is not None:
            tx.delete_procedure_row(stored)
        row = new.row()
        tx.put_procedure_row(row)
        rows.edges[new.key] = new
        rows.edge_rows[new.key] = row

    # -- refining ---------------------------------------------------------------------
    def _split(self, trajectories: list[Trajectory]) -> tuple[list[Trajectory], list[Trajectory]]:
        """(train, held out): per outcome, the trajectories ordered by a seeded hash of their id,
        every k-th held out (k = round(1 / holdout))."""
        every = max(2, round(1 / self.holdout))
        train: list[Trajectory] = []
        held: list[Trajectory] = []
        for outcome in OUTCOMES:
            group = sorted((t for t in trajectories if t.outcome == outcome),
                           key=lambda t: hashlib.sha256(f"{self.seed}:{t.id}".encode()).digest())
            for i, t in enumerate(group):
                (held if i % every == every - 1 else train).append(t)
        return train, held

    @staticmethod
    def _counting_proposals(train: list[Trajectory], limit: int = 8) -> list[Proposal]:
        """Transitions whose presence separates failures from successes in ``train``."""
        total = Counter(t.outcome for t in train)
        per: dict[tuple[str, str], Counter[str]] = {}
        for t in train:
            for transition in t.transitions:
                per.setdefault(transition, Counter())[t.outcome] += 1
        scored = []
        for (src, dst), counts in per.items():
            s, f = counts["success"], counts["failure"]
            rest_s, rest_f = total["success"] - s, total["failure"] - f
            fail_with = f / (s + f)
            fail_without = rest_f / (rest_s + rest_f) if rest_s + rest_f else 0.0
            if f >= 2 and fail_with >= 0.75 and fail_with - fail_without >= 0.3:
                text = f"{dst} right after {src} preceded failure in {f} of {s + f} recorded trajectories"
                scored.append((fail_with - fail_without, Proposal("add_pitfall", src, dst, "leads_to", text)))
            succ_with = s / (s + f)
            succ_without = rest_s / (rest_s + rest_f) if rest_s + rest_f else 1.0
            if s >= 2 and succ_with >= 0.9 and succ_with - succ_without >= 0.3:
                text = f"{src} then {dst} worked in {s} of {s + f} recorded trajectories"
                scored.append((succ_with - succ_without, Proposal("add_guidance", src, dst, "leads_to", text)))
        scored.sort(key=lambda item: (-item[0], item[1].key))
        return [p for _, p in scored[:limit]]

    @staticmethod
    def _validate(proposal: Proposal, held: list[Trajectory]) -> tuple[bool | None, str]:
        """(helps?, why) on the held-out trajectories; None when none of them takes the transition.

        A proposal helps when the outcome it predicts is more frequent among held-out
        trajectories taking its transition than among all held-out ones, and is the majority there.
        """
        transition = (proposal.src, proposal.dst)
        taking = [t for t in held if transition in t.transitions]
        if not taking:
            return None, "no held-out trajectory takes this transition"
        hits = sum(t.outcome == proposal.predicts for t in taking)
        base = sum(t.outcome == proposal.predicts for t in held) / len(held)
        precision = hits / len(taking)
        why = (f"{hits} of {len(taking)} held-out trajectories taking it ended in {proposal.predicts} "
               f"(base rate {base:.2f})")
        return precision >= 0.5 and precision > base, why

    def refine(self, *, proposer: Proposer | None = None, now: float | None = None) -> RefineReport:
        """Propose, validate and apply graph edits from the recorded trajectories.

        Nothing happens before ``min_trajectories`` are recorded. Proposals come from
        ``proposer`` (or the graph's own) given the contrast of successful and failed
        training trajectories; each is tested on the held-out ones; those that help are
        applied, those that do not are rejected, and both are remembered so they are not
        proposed again. A proposal that no held-out trajectory can test stays undecided.

        Raises:
            ValidationError: the proposer raised (its exception is the cause), returned a
                malformed proposal, more than ``MAX_PROPOSALS`` proposals or a string longer
                than ``MAX_PROPOSAL_TEXT`` characters; nothing is written then.
        """
        _check_proposer(proposer)
        proposer = proposer or self.proposer
        stamp = now_ts(now)
        rows = self._rows()
        report = RefineReport(trajectories=len(rows.trajectories))
        if len(rows.trajectories) < self.min_trajectories:
            report.skipped = (f"{len(rows.trajectories)} trajectories recorded; refining needs "
                              f"{self.min_trajectories}")
            return report
        train, held = self._split(rows.trajectories)
        if proposer is None:
            proposals = self._counting_proposals(train)
        else:
            contrast = {
                "successes": [self._brief(t) for t in train if t.outcome == "success"],
                "failures": [self._brief(t) for t in train if t.outcome == "failure"],
                "graph": self.to_dict(),
                "decided": sorted(rows.decided),
            }
            produced = call_model(proposer, contrast, "proposer")
            # a str or a Mapping (a model's {"proposals": [...]} parsed) would iterate as characters or keys
            if isinstance(produced, (str, bytes, Mapping)) or not isinstance(produced, Iterable):
                raise ValidationError(f"the proposer returned a {type(produced).__name__}; it must return a list "
                                      "of proposals", hint="return e.g. [{'op': 'add_pitfall', 'src': 'edit_file', "
                                                           "'dst': 'run_tests', 'text': 'run the linter first'}]")
            proposals = []
            for n, p in enumerate(iterate_model(produced, "proposer")):
                if n == MAX_PROPOSALS:  # an endless generator is never read to its end
                    raise ValidationError(f"the proposer returned more than {MAX_PROPOSALS} proposals",
                                          hint=f"make the proposer return at most {MAX_PROPOSALS} proposals (a list, "
                                               "or a generator that ends); nothing was written")
                proposals.append(Proposal.parse(p, n))
        seen: set[str] = set()
        decisions: list[tuple[Proposal, str, str]] = []
        for proposal in proposals:
            if proposal.key in seen:
                continue
            seen.add(proposal.key)
            if proposal.key in rows.decided:
                report.already_decided.append(proposal.key)
                continue
            report.proposed.append(proposal.to_dict())
            helps, why = self._validate(proposal, held)
            entry = {**proposal.to_dict(), "why": why}
            if helps is None:
                report.unvalidated.append(entry)
            elif helps:
                report.applied.append(entry)
                decisions.append((proposal, "applied", why))
            else:
                report.rejected.append(entry)
                decisions.append((proposal, "rejected", why))
        if decisions:
            with self.db.transaction() as tx:
                current = self._rows_in(tx)
                for proposal, status, why in decisions:
                    if proposal.key in current.decided:
                        continue  # another process decided it meanwhile
                    if status == "applied":
                        self._apply(tx, current, proposal)
                    tx.put_procedure_row({"row": "proposal", "key": proposal.key, "status": status, "reason": why,
                                          "proposal": proposal.to_dict(), "at": stamp})
        return report

    @staticmethod
    def _brief(t: Trajectory) -> dict[str, Any]:
        return {"id": t.id, "task": t.task, "tools": list(t.tools), "failed_calls": list(t.errors)}

    def _apply(self, tx: AgentTransaction, rows: _Rows, proposal: Proposal) -> None:
        for nid in (proposal.src, proposal.dst):
            if nid not in rows.nodes:
                node = (ProcedureNode(nid, "state", nid) if nid in (START, END)
                        else ProcedureNode(nid, "action", tool_name(nid)))
                rows.nodes[nid] = node
                tx.put_procedure_row(node.row())
        key = (proposal.src, proposal.dst, proposal.relation)
        old = rows.edges.get(key, ProcedureEdge(*key))
        if proposal.op == "add_pitfall":
            pitfalls = old.pitfalls if proposal.text in old.pitfalls else (*old.pitfalls, proposal.text)
            new = ProcedureEdge(old.src, old.dst, old.relation, proposal.condition or old.condition, old.guidance,
                                pitfalls, old.success, old.failure)
        else:
            new = ProcedureEdge(old.src, old.dst, old.relation, proposal.condition or old.condition,
                                proposal.text or old.guidance, old.pitfalls, old.success, old.failure)
        self._replace_edge(tx, rows, old, new)

    # -- guidance ---------------------------------------------------------------------
    def guidance_for(self, task_text: str, *, min_overlap: float = 0.5, max_steps: int = 12) -> str:
        """The procedure that worked for similar tasks, as prompt text ("" when none is similar).

        Similar: the recorded task shares at least ``min_overlap`` of the smaller word set
        with ``task_text``. The steps are the most frequent successful tool path among
        similar trajectories; guidance and pitfalls of the edges along it follow.

        Raises:
            ValidationError: ``task_text`` is not a string.
        """
        if not isinstance(task_text, str):
            raise ValidationError("guidance_for() takes the task's text")
        if isinstance(min_overlap, bool) or not isinstance(min_overlap, (int, float)) or not 0 <= min_overlap <= 1:
            raise ValidationError(f"min_overlap must be a number in [0, 1], got {min_overlap!r}")
        steps = as_int(max_steps)
        if steps is None or steps < 1:
            raise ValidationError(f"max_steps must be a positive int, got {max_steps!r}")
        max_steps = steps
        words = content_words(task_text)
        rows = self._rows()
        similar = [t for t, task in zip(rows.trajectories, rows.task_words(), strict=True)
                   if overlap(words, task) >= min_overlap]
        wins = [t for t in similar if t.outcome == "success" and t.tools]
        if not wins:
            return ""
        paths = Counter(t.tools for t in wins)
        latest = {t.tools: t.seq for t in wins}
        path = min(paths, key=lambda p: (-paths[p], -latest[p]))
        lines = ["## Procedure",
                 f"What worked for similar tasks ({len(wins)} of {len(similar)} similar trajectories succeeded):"]
        full = _path(path)
        for i, tool in enumerate(path[:max_steps], 1):
            edge = rows.edges.get((full[i - 1], full[i], "leads_to"))
            lines.append(f"{i}. {tool}" + (f": {edge.guidance}" if edge and edge.guidance else ""))
        if len(path) > max_steps:
            lines.append(f"... and {len(path) - max_steps} more steps")
        on_path = set(full[1:-1])
        pitfalls = sorted({p for e in rows.edges.values() if e.src in on_path or e.dst in on_path
                           for p in e.pitfalls})
        fallbacks = sorted(f"if {tool_name(e.dst)} fails, {tool_name(e.src)} worked instead" for e in rows.edges.values()
                           if e.relation == "fallback_for" and e.dst in on_path and e.success)
        if pitfalls or fallbacks:
            lines.append("Pitfalls:")
            lines.extend(f"- {text}" for text in [*pitfalls, *fallbacks])
        return "\n".join(lines)
