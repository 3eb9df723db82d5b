"""What the API remembers for robots while the database is away (relay_api.outage_memory): another
user's deployment is never answered from it, a revoked key is forgotten, and once the database was
found away only one request at a time tries it again."""

from __future__ import annotations

import time

from relay_api.outage_memory import OutageMemory


def route(deployment_id: str, user_id: int) -> dict[str, object]:
    return {
        "id": deployment_id,
        "user_id": user_id,
        "status": "ready",
        "error": None,
        "attempt": 1,
        "internal_url": "http://127.0.0.1:1",
        "internal_token": "secret",
        "stop_requested_at": None,
        "config": {"not": "kept"},
    }


def test_a_deployment_is_remembered_for_its_owner_only_and_a_revoked_key_is_forgotten() -> None:
    memory = OutageMemory()
    memory.remember_deployment(route("dep-1", user_id=7))
    assert memory.deployment(7, "dep-1") == {k: v for k, v in route("dep-1", 7).items() if k != "config"}
    assert memory.deployment(8, "dep-1") is None and memory.deployment(7, "dep-2") is None
    memory.remember_key("relay-key", 7)
    assert memory.user_of("relay-key") == 7 and memory.user_of("relay-other") is None
    memory.remember_key("relay-key", None)  # the database says it is no longer active
    assert memory.user_of("relay-key") is None


def test_after_an_outage_one_caller_at_a_time_tries_the_database_again() -> None:
    memory = OutageMemory(retry_seconds=2.0)
    assert not memory.skip_database()  # the database answered last
    memory.note_outage()
    assert memory.skip_database() and memory.skip_database()
    time.sleep(2.1)
    assert not memory.skip_database()  # this caller tries the database...
    assert memory.skip_database()  # ...while the others answer from memory
    memory.note_back()
    assert not memory.skip_database() and not memory.skip_database()
