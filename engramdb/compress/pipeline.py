"""``compress``: text -> zettels, tunnels and an entity index, byte-identical every run.

The pipeline (spec/compress.md):

1. normalize the text (NFC, LF line breaks) and scan it once for dates and session
   headers and for entity evidence;
2. chunk it on paragraph boundaries, in chat on message boundaries (session headers
   always start a chunk);
3. per chunk: entities (+ pronoun coreference), topics, quote, flags, emotions, raw
   weight and resolved date;
4. optionally merge near-duplicates (``dedupe``);
5. link tunnels, blend tunnel centrality into the weights, rank-normalize them.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any
from collections.abc import Iterable, Sequence

from ..errors import ValidationError
from ..records import CompressResult, EntityIndex, Zettel
from . import zc
from .dates import DateIndex, PartialDate
from .entities import (
    EntityEvidence,
    LineLabels,
    assign_codes,
    build_entity_index,
    chunk_entities,
    message_speaker,
    resolve_coreferences,
)
from .links import build_tunnels, dedupe_zettels
from .normalize import TextChunk, chunk_text, normalize_text, tokenize
from .options import CompressOptions, parse_options
from .quote import select_quote
from .signals import FLAG_KEYWORDS, detect
from .topics import BASE_STOP_WORDS, extract_topics, speaker_names
from .weights import blend_centrality, normalize_weights, raw_weight

__all__ = ["compress", "compress_many", "merge_results", "top_zettels", "zettel_id"]

MIN_MEANINGFUL_INPUT = 40
_REFINED_DECISION = zc.keyword_pattern(FLAG_KEYWORDS["DECISION"])


def zettel_id(number: int) -> str:
    """The id of the ``number``-th zettel (1-based): ``"001"``, ..., ``"999"``, ``"1000"``."""
    return f"{number:03d}"


@dataclass
class Analysis:
    """The per-chunk output of one document, before dedupe, tunnels and normalization."""

    normalized: str
    chunks: list[TextChunk]
    zettels: list[Zettel]
    recent: list[str] = field(default_factory=list)
    session: PartialDate | None = None
    warnings: list[str] = field(default_factory=list)


def analyze(
    text: str,
    opts: CompressOptions,
    *,
    first_id: int = 1,
    recent: Sequence[str] = (),
    session: PartialDate | None = None,
    gender: dict[str, str] | None = None,
) -> Analysis:
    """Normalize, chunk and analyze ``text`` into zettels with raw weights.

    ``recent``, ``session`` and ``gender`` carry a stream's coreference and
    session-date state in (``gender`` is updated with this text's evidence).
    Zettel entities are names; the caller codes them.
    """
    normalized = normalize_text(text)
    warnings: list[str] = []
    dates = DateIndex.scan(normalized, opts.date)
    stripped = len(text.strip())
    if stripped < MIN_MEANINGFUL_INPUT:
        warnings.append(f"input is {stripped} chars: too short for meaningful compression")
    chunks = chunk_text(normalized, opts.chunk_size, opts.chunk_overlap, dates.header_offsets())
    if not chunks:
        return Analysis(normalized, [], [], list(recent), dates.last_header(session), warnings)

    evidence = EntityEvidence.scan(normalized)
    tokens = [tokenize(c.text) for c in chunks]
    lower_sets = [set(low) for _, low in tokens]
    named = [chunk_entities(c.text, evidence, opts.min_entity_frequency, raw) for c, (raw, _) in zip(chunks, tokens)]
    lines = LineLabels(normalized)
    for names, chunk in zip(named, chunks):
        # a chunk that continues a message too long for one chunk keeps its speaker
        who = message_speaker(normalized, chunk.start, evidence, lines)
        if who is not None and who not in names:
            names.insert(0, who)
    if gender is not None:
        gender.update(evidence.gender)
    entities, recent_out = resolve_coreferences(
        lower_sets, named, gender if gender is not None else evidence.gender, recent
    )
    stop = BASE_STOP_WORDS | frozenset(opts.stop_words) if opts.stop_words else BASE_STOP_WORDS
    speakers = speaker_names(normalized)

    precise = "decision-precision" in opts.fixes
    zettels = []
    prev_end = 0
    for k, chunk in enumerate(chunks):
        signals = detect(chunk.text, tokens[k][1], lower_sets[k])
        if precise and "DECISION" in signals.flags and not zc.precise_decision(chunk.text, _REFINED_DECISION):
            signals = replace(signals, flags=tuple(f for f in signals.flags if f != "DECISION"))
        # the quote comes from the chunk's own text: its overlap with the previous
        # chunk often starts mid-sentence and was already quotable there
        own = chunk.text[max(0, prev_end - chunk.start):]
        prev_end = chunk.end
        zettels.append(Zettel(
            id=zettel_id(first_id + k),
            entities=entities[k],
            topics=extract_topics(chunk.text, stop, speakers, tokens=tokens[k]),
            quote=select_quote(own if len(own.split()) >= 5 else chunk.text, lower_sets[k]),
            weight=raw_weight(signals),
            emotions=list(signals.emotions),
            flags=list(signals.flags),
            source_start=chunk.start,
            source_end=chunk.end,
            resolved_date=dates.resolve(chunk.start, chunk.end, session, lower_sets[k]),
        ))
    return Analysis(normalized, chunks, zettels, recent_out, dates.last_header(session), warnings)


def _meta(input_length: int, chunk_count: int, opts: CompressOptions, warnings: list[str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"input_length": input_length, "chunk_count": chunk_count}
    if opts.date is not None:
        meta["date"] = opts.date
    if opts.title is not None:
        meta["title"] = opts.title
    meta["warnings"] = list(warnings)
    return meta


def _compress_refined(text: str, opts: CompressOptions) -> CompressResult:
    """engramdb's own pipeline (``method="refined"``, sections 2-8 of spec/compress.md)."""
    analysis = analyze(text, opts)
    zettels = analysis.zettels
    if "first-name-aliases" in opts.fixes:
        merged = zc.merge_first_name_aliases([z.entities for z in zettels], zc.detect_speaker_names(analysis.normalized))
        for z, names in zip(zettels, merged):
            z.entities = names
    index = build_entity_index(name for z in zettels for name in z.entities)
    if opts.dedupe:
        zettels = dedupe_zettels(zettels, opts.dedupe_threshold)
    tunnels = build_tunnels(zettels, index, opts.tunnel_threshold, opts.tunnel_top_k, opts.verbose_labels)
    blend_centrality(zettels, tunnels)
    normalize_weights(zettels, opts.temperature)
    meta = _meta(len(text), len(analysis.chunks), opts, analysis.warnings)
    if opts.keep_source:
        meta["source"] = analysis.normalized
    return CompressResult(zettels=zettels, tunnels=tunnels, entity_index=index, meta=meta)


def _compress(text: str, opts: CompressOptions) -> CompressResult:
    """zettel-compress 1.0.0's pipeline (:mod:`.zc`) plus the fixes ``opts.fixes`` names."""
    if opts.method == "refined":
        return _compress_refined(text, opts)
    normalized = zc.normalize_text(text)
    warnings: list[str] = []
    stripped = len(zc.js_trim(text))
    if stripped < MIN_MEANINGFUL_INPUT:
        warnings.append(f"input is {stripped} chars: too short for meaningful compression")
    cut_long = "long-paragraphs" in opts.fixes
    chunks = zc.chunk_text(normalized, opts.chunk_size, opts.chunk_overlap, cut_long)
    block = zc.TEXTRANK_BLOCK if cut_long else None
    detected = [zc.detect_entities(c.text, opts.min_entity_frequency) for c in chunks]
    entities = zc.resolve_coreferences(chunks, detected)
    speakers = zc.detect_speaker_names(normalized)
    if "first-name-aliases" in opts.fixes:
        entities = zc.merge_first_name_aliases(entities, speakers)
    index = zc.build_entity_index(name for names in entities for name in names)
    hits = zc.scan_document_dates(normalized)
    starts = [h.index for h in hits]
    stop = zc.BASE_STOP_WORDS | frozenset(opts.stop_words) if opts.stop_words else zc.BASE_STOP_WORDS
    precise = "decision-precision" in opts.fixes
    zettels = []
    for k, chunk in enumerate(chunks):
        flags = zc.detect_flags(chunk.text, precise)
        emotions = zc.detect_emotions(chunk.text)
        zettels.append(Zettel(
            id=zettel_id(k + 1),
            entities=entities[k],
            topics=zc.extract_topics(chunk.text, stop, speakers),
            quote=zc.select_key_sentence(chunk.text, block),
            weight=zc.compute_weight(emotions, flags, chunk.text),
            emotions=emotions,
            flags=flags,
            source_start=chunk.start,
            source_end=chunk.end,
            resolved_date=zc.resolve_chunk_date(chunk.text, opts.date, hits, chunk.start, starts),
        ))
    if opts.dedupe:
        zettels = dedupe_zettels(zettels, opts.dedupe_threshold)
    tunnels = zc.build_tunnels(zettels, index, opts.tunnel_threshold, opts.tunnel_top_k, opts.verbose_labels)
    blend_centrality(zettels, tunnels)
    normalize_weights(zettels, opts.temperature)
    meta = _meta(len(text), len(chunks), opts, warnings)
    if opts.keep_source:
        meta["source"] = normalized
    return CompressResult(zettels=zettels, tunnels=tunnels, entity_index=index, meta=meta)


def _check_text(text: Any, what: str = "text") -> str:
    if not isinstance(text, str):
        raise ValidationError(
            f"{what} must be a str, got {type(text).__name__}",
            hint="decode bytes first, e.g. data.decode('utf-8')",
        )
    return text


def compress(text: str, **options: Any) -> CompressResult:
    """Compress ``text`` into zettels, tunnels and an entity index.

    The same text and options give a byte-identical result in every process and on
    every machine (see spec/compress.md, "Determinism").

    Args:
        text: the document or conversation. Chat lines like ``"Alice: hi"`` keep their
            speaker as an entity; a session header line such as ``"[2023-05-08]
            Session 3"`` or ``"DATE: 8 May 2023"`` dates the chunks that follow it.
        **options: ``chunk_size=800``, ``chunk_overlap=100`` (snapped to word
            boundaries; at most half of ``chunk_size`` when not given), ``date`` (ISO or "8 May 2023"; the fallback for resolved
            dates), ``title``, ``min_entity_frequency=1``, ``stop_words`` (extra topic
            stop words), ``temperature=0.5`` (weight softmax; lower = sharper),
            ``tunnel_threshold=0.3``, ``tunnel_top_k=3``, ``dedupe=False``,
            ``dedupe_threshold=0.9``, ``verbose_labels=False`` (entity names instead of
            codes in tunnel labels), ``keep_source=True`` (keep the normalized text in
            ``meta["source"]``; zettel offsets index into it),
            ``method="zettel-compress"`` (zettel-compress 1.0.0's algorithm; ``"refined"``
            for engramdb's own pipeline with chat-aware chunking, see spec/compress.md),
            ``fixes=("decision-precision", "first-name-aliases", "long-paragraphs")`` (the deliberate
            departures from zettel-compress; ``()`` for its exact output).

    Returns:
        A :class:`~engramdb.records.CompressResult`; ``meta`` has ``input_length``,
        ``chunk_count``, ``warnings``, and ``date``/``title``/``source`` when set.

    Raises:
        ValidationError: ``text`` is not a string, an option is unknown or out of range,
            or ``date`` is not a date (YYYY-MM-DD, YYYY-MM, YYYY or an English date).
    """
    return _compress(_check_text(text), parse_options(options))


def compress_many(texts: Iterable[str], **options: Any) -> list[CompressResult]:
    """:func:`compress` each text with the same options.

    Raises:
        ValidationError: ``texts`` is a single string or holds a non-string, or an option
            is invalid.
    """
    if isinstance(texts, str):
        raise ValidationError("compress_many takes a list of texts, not one string", hint="use compress(text)")
    opts = parse_options(options)
    return [_compress(_check_text(t, "every text"), opts) for t in texts]


def _copy(z: Zettel, new_id: str) -> Zettel:
    return Zettel(
        id=new_id, entities=list(z.entities), topics=list(z.topics), quote=z.quote, weight=z.weight,
        emotions=list(z.emotions), flags=list(z.flags), source_start=None, source_end=None,
        resolved_date=z.resolved_date,
    )


def merge_results(results: Sequence[CompressResult], **options: Any) -> CompressResult:
    """Merge several results into one, with weights re-normalized onto one scale.

    Zettels are renumbered in order; source offsets are dropped (a merged result has no
    single source); the entity index is rebuilt over all names and tunnels are linked
    anew. Accepts the tunnel and weight options of :func:`compress`
    (``tunnel_threshold``, ``tunnel_top_k``, ``temperature``, ``verbose_labels``).

    Raises:
        ValidationError: ``results`` holds something other than CompressResults, or an
            option is unknown or invalid.
    """
    opts = parse_options(options, allowed=("tunnel_threshold", "tunnel_top_k", "temperature", "verbose_labels"))
    results = list(results)
    for r in results:
        if not isinstance(r, CompressResult):
            raise ValidationError(
                f"merge_results takes CompressResults, got {type(r).__name__}", hint="pass compress() outputs"
            )
    zettels = [_copy(z, zettel_id(k + 1)) for k, z in enumerate(z for r in results for z in r.zettels)]
    index = build_entity_index(name for z in zettels for name in z.entities)
    tunnels = build_tunnels(zettels, index, opts.tunnel_threshold, opts.tunnel_top_k, opts.verbose_labels)
    blend_centrality(zettels, tunnels)
    normalize_weights(zettels, opts.temperature)
    warnings = [w for r in results for w in r.meta.get("warnings", ())]
    meta: dict[str, Any] = {
        "input_length": sum(int(r.meta.get("input_length", 0)) for r in results),
        "chunk_count": len(zettels),
        "warnings": warnings,
    }
    return CompressResult(zettels=zettels, tunnels=tunnels, entity_index=index, meta=meta)


def top_zettels(result: CompressResult, n: int) -> list[Zettel]:
    """The ``n`` heaviest zettels, heaviest first (document order on ties).

    Raises:
        ValidationError: ``result`` is not a CompressResult or ``n`` is not a
            non-negative integer.
    """
    if not isinstance(result, CompressResult):
        raise ValidationError(f"expected a CompressResult, got {type(result).__name__}",
                              hint="pass the value compress() returned")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValidationError("n must be a non-negative integer", hint="e.g. top_zettels(result, 5)")
    order = sorted(range(len(result.zettels)), key=lambda i: (-result.zettels[i].weight, i))
    return [result.zettels[i] for i in order[:n]]


def extend_index(index: EntityIndex, names: Iterable[str]) -> None:
    """Code new names into an existing index; codes already given never change."""
    assign_codes(index, names)
