"""Users and their API keys. A key is shown once, at creation; the database keeps its sha256."""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from relay_api.db import utcnow
from relay_api.models import ApiKey, User, api_keys

KEY_PREFIX = "relay-"
USER_NAME_MAX = 64


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def check_user_name(name: str) -> str:
    if not name or len(name) > USER_NAME_MAX or not all(ch.isalnum() or ch in "-_.@" for ch in name):
        raise ValueError(
            f"bad user name {name!r}: 1 to {USER_NAME_MAX} letters, digits, '-', '_', '.' or '@'"
        )
    return name


def get_or_create_user(db: Session, name: str) -> User:
    check_user_name(name)
    user = db.scalar(select(User).where(User.name == name))
    if user is not None:
        return user
    try:
        with db.begin_nested():
            user = User(name=name)
            db.add(user)
    except IntegrityError:  # created meanwhile by someone else
        user = db.scalar(select(User).where(User.name == name))
        assert user is not None
    return user


@dataclass(frozen=True)
class NewKey:
    user: str
    key: str
    prefix: str


def create_key(db: Session, user_name: str) -> NewKey:
    """Create a key for `user_name` (and the user if new), and commit. Only the result holds the key."""
    user = get_or_create_user(db, user_name)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    prefix = key[: len(KEY_PREFIX) + 6]
    db.add(ApiKey(user_id=user.id, key_hash=hash_key(key), prefix=prefix))
    db.commit()
    return NewKey(user=user.name, key=key, prefix=prefix)


def list_keys(db: Session) -> list[tuple[str, str, str, str | None]]:
    """(user, key prefix, created_at, revoked_at) for every key."""
    rows = db.execute(
        select(User.name, ApiKey.prefix, ApiKey.created_at, ApiKey.revoked_at)
        .join(User, User.id == ApiKey.user_id)
        .order_by(User.name, ApiKey.id)
    )
    return [
        (name, prefix, created.isoformat(), revoked.isoformat() if revoked else None)
        for name, prefix, created, revoked in rows
    ]


class AmbiguousKey(ValueError):
    """A prefix that names keys of more than one user, or several keys: revoking all would be a guess."""


def revoke_keys(db: Session, key_or_prefix: str, user_name: str | None = None) -> int:
    """Revoke a key, given whole or by the prefix `relay keys list` shows (of `user_name`'s keys, if
    given); returns how many were revoked (0 or 1). A prefix that matches several active keys is
    refused (AmbiguousKey): a prefix is shown for reading, and two keys may share one."""
    if len(key_or_prefix) > len(KEY_PREFIX) + 6:
        match = ApiKey.key_hash == hash_key(key_or_prefix)
    else:
        match = ApiKey.prefix == key_or_prefix
    active = select(ApiKey.id, User.name).join(User, User.id == ApiKey.user_id)
    active = active.where(match, ApiKey.revoked_at.is_(None))
    if user_name is not None:
        active = active.where(User.name == user_name)
    found = db.execute(active).all()
    if len(found) > 1:
        owners = ", ".join(sorted({name for _, name in found}))
        raise AmbiguousKey(
            f"{key_or_prefix} matches {len(found)} active keys (of {owners}); give the whole key, "
            "or the user with --user"
        )
    if not found:
        return 0
    db.execute(update(ApiKey).where(ApiKey.id == found[0][0]).values(revoked_at=utcnow()))
    db.commit()
    return 1


class KeyCache:
    """Which user a key belongs to, remembered for a little while so a request needs no lookup."""

    def __init__(self, ttl_seconds: float) -> None:
        self.ttl = ttl_seconds
        self._known: dict[str, tuple[int, float]] = {}
        self._lock = threading.Lock()

    def known(self, key: str) -> int | None:
        """The user of a key checked less than `ttl` seconds ago, without asking the database."""
        with self._lock:
            known = self._known.get(hash_key(key))
        return known[0] if known is not None and known[1] > time.monotonic() else None

    def look_up(self, db: Session, key: str) -> int | None:
        """The user of an active key, from the database (and remembered)."""
        digest = hash_key(key)
        user_id = db.scalar(
            select(api_keys.c.user_id).where(api_keys.c.key_hash == digest, api_keys.c.revoked_at.is_(None))
        )
        db.rollback()  # end the read here, in this thread
        if user_id is not None and self.ttl > 0:
            with self._lock:
                if len(self._known) > 10_000:
                    self._known.clear()
                self._known[digest] = (user_id, time.monotonic() + self.ttl)
        return user_id
