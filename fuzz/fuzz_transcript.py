"""Coverage-guided fuzzing of the conversation serializer (atheris / libFuzzer).

Run (see fuzz/README.md)::

    python fuzz/fuzz_transcript.py /tmp/transcript-new fuzz/corpus/transcript -max_total_time=60

The input is a JSON document (OpenAI chat or Anthropic messages, or anything else); what
parses as JSON goes to ``engramdb.agent.serialize_conversation`` and to the ingest
renderer (``engramdb.ingest.messages_to_text``), the two readers of agent transcripts.

Oracle: the only exception either may raise is an ``EngramError``; an accepted transcript
is consistent (``tool_sequence`` is the turns' calls in order, ``has_errors`` is whether
one of them failed, every result belongs to a call) and serializing it again gives the
same result; ``messages_to_text`` refuses a document that is not a list.
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

if __name__ == "__main__":
    import atheris

    with atheris.instrument_imports(include=["engramdb"]):
        from engramdb.agent.serialize import serialize_conversation
        from engramdb.errors import EngramError
        from engramdb.ingest import messages_to_text
else:  # imported by tests/test_fuzz_regressions.py to replay the corpus without atheris
    from engramdb.agent.serialize import serialize_conversation
    from engramdb.errors import EngramError
    from engramdb.ingest import messages_to_text


def TestOneInput(data: bytes) -> None:
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return
    try:
        conv = serialize_conversation(document)
    except EngramError:
        conv = None
    if conv is not None:
        calls = [call for turn in conv.turns for call in turn.tool_calls]
        assert conv.tool_sequence == [call.name for call in calls], (conv.tool_sequence, calls)
        assert conv.has_errors == any(call.is_error for call in calls)
        assert all(call.result is not None or not call.is_error for call in calls)
        assert serialize_conversation(document).to_dict() == conv.to_dict()
        json.dumps(conv.to_dict(), default=str)
    try:
        messages_to_text(document)
    except EngramError:
        pass
    else:  # a JSON object, string or number is not a list of messages (a dict would be read as its keys)
        assert isinstance(document, list), f"messages_to_text accepted a {type(document).__name__}"


if __name__ == "__main__":
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()
