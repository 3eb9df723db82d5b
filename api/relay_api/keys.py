"""Users and their API keys. A key is shown once, at creation; the database keeps its sha256."""

from __future__ import annotations

import hashlib
import math
import secrets
import threading
import time
from dataclasses import dataclass

from sqlalchemy import bindparam, func, select, update
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


# A remembered key is trusted only while a read of the revocation count that started less than
# this long ago found it unchanged: a key revoked anywhere (another API process, `relay keys
# revoke`) is refused by every API process within this long, for one small read per this long.
REVOCATION_CHECK_SECONDS = 0.5

# One statement, so one snapshot: the count of revoked keys (it only grows; nothing deletes keys)
# and the user of the key, if it is active.
_LOOK_UP = select(
    select(func.count(api_keys.c.revoked_at)).scalar_subquery(),
    select(api_keys.c.user_id)
    .where(api_keys.c.key_hash == bindparam("digest"), api_keys.c.revoked_at.is_(None))
    .scalar_subquery(),
)


class KeyCache:
    """Which user a key belongs to, remembered for up to `ttl` seconds so a request needs no
    lookup, as long as no key was revoked since it was looked up (see REVOCATION_CHECK_SECONDS)."""

    def __init__(self, ttl_seconds: float, check_seconds: float = REVOCATION_CHECK_SECONDS) -> None:
        self.ttl = ttl_seconds
        self.check_seconds = check_seconds
        self._known: dict[str, tuple[int, int, float]] = {}  # digest: (user, revocations, until)
        self._revocations = -1  # the latest count read
        self._checked_at = -math.inf  # when the read that found it started (monotonic)
        self._lock = threading.Lock()

    def known(self, key: str) -> int | None:
        """The user of a key looked up less than `ttl` seconds ago, without asking the database,
        while the revocation count read less than `check_seconds` ago is the one it was looked up at."""
        now = time.monotonic()
        with self._lock:
            if now - self._checked_at > self.check_seconds:
                return None
            known = self._known.get(hash_key(key))
            revocations = self._revocations
        if known is None or known[1] != revocations or known[2] <= now:
            return None
        return known[0]

    def look_up(self, db: Session, key: str) -> int | None:
        """The user of an active key, from the database (and remembered), with the revocation count."""
        digest = hash_key(key)
        started = time.monotonic()
        revocations, user_id = db.execute(_LOOK_UP, {"digest": digest}).one()
        db.rollback()  # end the read here, in this thread
        with self._lock:
            if started >= self._checked_at:  # a slower, older read must not undo a newer one
                self._revocations, self._checked_at = revocations, started
            if user_id is not None and self.ttl > 0:
                if len(self._known) > 10_000:
                    self._known.clear()
                self._known[digest] = (user_id, revocations, time.monotonic() + self.ttl)
        return user_id
