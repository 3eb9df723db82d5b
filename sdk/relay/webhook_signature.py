"""Webhook signatures as the Standard Webhooks specification writes them (standardwebhooks.com).

A secret is ``whsec_`` + base64 of random bytes; a message is signed with HMAC-SHA256 keyed with
the secret's decoded bytes over ``"{webhook-id}.{webhook-timestamp}.{body}"``, and the
``webhook-signature`` header carries ``v1,<base64 signature>`` (several, space-separated, while a
secret is being rotated). The worker signs with it (relay_worker.webhook_dispatch); a receiver
verifies with `verify`, or with any Standard Webhooks library. Standard library only, on purpose:
the SDK's receivers and the service's workers need nothing more.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping

SECRET_PREFIX = "whsec_"
# 32 random bytes: the specification asks for 24 at least.
SECRET_BYTES = 32
SIGNATURE_VERSION = "v1"
# How far a message's timestamp may be from the receiver's clock: the specification's suggestion,
# which keeps a captured message from being replayed later.
TOLERANCE_SECONDS = 5 * 60


class WebhookVerificationError(ValueError):
    """A message whose headers are missing, too old or too new, or whose signature does not match."""


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def _key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header's value for one message."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return f"{SIGNATURE_VERSION},{base64.b64encode(digest).decode()}"


def headers(secret: str, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three headers a signed message carries."""
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, message_id, timestamp, body),
    }


def verify(secret: str, body: bytes, received: Mapping[str, str], *, now: float | None = None) -> None:
    """Check a received message (its raw body and its headers, any case); raise
    WebhookVerificationError unless one of its signatures is the secret's and its timestamp is
    within TOLERANCE_SECONDS of `now`."""
    lowered = {name.lower(): value for name, value in received.items()}
    message_id = lowered.get("webhook-id")
    stamp = lowered.get("webhook-timestamp")
    given = lowered.get("webhook-signature")
    if not message_id or not stamp or not given:
        raise WebhookVerificationError("missing webhook-id, webhook-timestamp or webhook-signature")
    try:
        timestamp = int(stamp)
    except ValueError:
        raise WebhookVerificationError(f"bad webhook-timestamp: {stamp[:40]!r}") from None
    if abs((time.time() if now is None else now) - timestamp) > TOLERANCE_SECONDS:
        raise WebhookVerificationError("the message's timestamp is too far from now")
    expected = sign(secret, message_id, timestamp, body).partition(",")[2]
    for candidate in given.split():
        version, _, signature = candidate.partition(",")
        if version == SIGNATURE_VERSION and hmac.compare_digest(signature, expected):
            return
    raise WebhookVerificationError("no matching signature")
