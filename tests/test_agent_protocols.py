"""engramdb.agent.protocols: an open Engram and its transaction are what the agent layer takes."""
from __future__ import annotations

from engramdb.agent import AgentMemory, AgentTransaction, MemoryHooks


def test_an_engram_and_its_transaction_satisfy_the_agent_protocols(make_db):
    db = make_db()
    assert isinstance(db, AgentMemory)
    with db.transaction() as tx:
        assert isinstance(tx, AgentTransaction)
    # the hooks run on it through the protocol's methods only
    ids = MemoryHooks(db).after_task([{"role": "user", "content": "I always deploy with blue-green releases."}],
                                     now=1_700_000_000.0)
    assert ids and all(i in db for i in ids)
    assert [h.id for h in MemoryHooks(db).relevant("blue-green releases")] == ids[:1]


def test_an_object_missing_a_method_is_not_agent_memory():
    class NotAStore:
        def recall(self, query: str) -> list[object]:
            return []

    assert not isinstance(NotAStore(), AgentMemory)
