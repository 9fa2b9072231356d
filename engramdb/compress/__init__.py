"""engramdb.compress: text -> zettels, pure and deterministic (no file needed).

See spec/compress.md. The public names:

* :func:`compress`, :func:`compress_many`, :func:`merge_results`, :func:`top_zettels`,
  :func:`normalize_weights`, :func:`recall_result`;
* :func:`inject_context`, :func:`wake_up`, :func:`estimate_tokens`;
* :class:`CompressStream`;
* :func:`result_to_dict`, :func:`result_to_json` (canonical serialization);
* :data:`ALL_FLAGS`, :data:`ALL_EMOTIONS`.
"""
from __future__ import annotations

from ..records import ALL_EMOTIONS, ALL_FLAGS
from .context import estimate_tokens, inject_context, wake_up
from .options import CompressOptions
from .pipeline import compress, compress_many, merge_results, top_zettels
from .recall import recall_result
from .serialize import result_to_dict, result_to_json
from .stream import CompressStream
from .weights import normalize_weights

__all__ = [
    "ALL_EMOTIONS",
    "ALL_FLAGS",
    "CompressOptions",
    "CompressStream",
    "compress",
    "compress_many",
    "estimate_tokens",
    "inject_context",
    "merge_results",
    "normalize_weights",
    "recall_result",
    "result_to_dict",
    "result_to_json",
    "top_zettels",
    "wake_up",
]
