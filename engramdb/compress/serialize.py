"""Canonical plain-data form of a :class:`~engramdb.records.CompressResult`.

``result_to_json`` is what determinism is defined over (spec/compress.md): sorted keys,
compact separators, UTF-8 text kept as is and floats in shortest round-trip form, so
two results are equal exactly when their JSON strings are.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from ..errors import ValidationError
from ..records import CompressResult, Zettel

__all__ = ["result_to_dict", "result_to_json", "zettel_to_dict"]


def zettel_to_dict(z: Zettel) -> dict[str, Any]:
    """A zettel as a plain dict (field names as in :class:`~engramdb.records.Zettel`)."""
    return asdict(z)


def result_to_dict(result: CompressResult) -> dict[str, Any]:
    """A result as plain dicts and lists.

    Raises:
        ValidationError: ``result`` is not a CompressResult.
    """
    if not isinstance(result, CompressResult):
        raise ValidationError(
            f"expected a CompressResult, got {type(result).__name__}", hint="pass the value compress() returned"
        )
    return {
        "zettels": [zettel_to_dict(z) for z in result.zettels],
        "tunnels": [{"from_id": t.from_id, "to_id": t.to_id, "label": t.label} for t in result.tunnels],
        "entity_index": {
            "name_to_code": dict(result.entity_index.name_to_code),
            "code_to_name": dict(result.entity_index.code_to_name),
        },
        "meta": dict(result.meta),
    }


def result_to_json(result: CompressResult) -> str:
    """The canonical JSON text of a result (sorted keys, no whitespace, UTF-8 kept).

    Raises:
        ValidationError: ``result`` is not a CompressResult or its meta is not JSON data.
    """
    try:
        return json.dumps(result_to_dict(result), sort_keys=True, ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ValidationError):
            raise
        raise ValidationError(f"result is not JSON data: {exc}", hint="meta values must be JSON-like") from exc
