"""relay.webhook_signature against the Standard Webhooks specification's own example, and against
the independent `standardwebhooks` package both ways (it signs, we verify; we sign, it verifies)."""

from __future__ import annotations

import base64
import datetime as dt
import time

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from relay import webhook_signature as signature

# The example of the specification (github.com/standard-webhooks/standard-webhooks, spec and libraries).
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TIMESTAMP = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_the_specifications_example_is_signed_as_it_says() -> None:
    assert signature.sign(SPEC_SECRET, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY) == SPEC_SIGNATURE
    headers = signature.headers(SPEC_SECRET, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY)
    assert headers == {
        "webhook-id": SPEC_ID,
        "webhook-timestamp": str(SPEC_TIMESTAMP),
        "webhook-signature": SPEC_SIGNATURE,
    }
    signature.verify(SPEC_SECRET, SPEC_BODY, headers, now=SPEC_TIMESTAMP + 10)


def test_a_new_secret_is_the_standard_form() -> None:
    secret = signature.new_secret()
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) >= 24
    assert signature.new_secret() != secret


def test_what_we_sign_standardwebhooks_verifies_and_the_reverse() -> None:
    secret, body, now = (
        signature.new_secret(),
        b'{"id":"evt_1","type":"fine_tune.succeeded"}',
        int(time.time()),
    )
    ours = signature.headers(secret, "evt_1", now, body)
    assert Webhook(secret).verify(body, ours) == {"id": "evt_1", "type": "fine_tune.succeeded"}
    theirs = Webhook(secret).sign("evt_2", dt.datetime.fromtimestamp(now, dt.UTC), body.decode())
    signature.verify(
        secret, body, {"Webhook-Id": "evt_2", "Webhook-Timestamp": str(now), "Webhook-Signature": theirs}
    )


@pytest.mark.parametrize(
    "change",
    [
        {"webhook-signature": "v1,AAAA"},
        {"webhook-id": "evt_other"},
        {"webhook-timestamp": str(SPEC_TIMESTAMP - 1)},
        {"webhook-signature": SPEC_SIGNATURE.replace("v1,", "v2,")},
        {"webhook-signature": ""},
    ],
)
def test_a_changed_header_fails_here_and_in_standardwebhooks(change: dict[str, str]) -> None:
    headers = {**signature.headers(SPEC_SECRET, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY), **change}
    with pytest.raises(signature.WebhookVerificationError):
        signature.verify(SPEC_SECRET, SPEC_BODY, headers, now=SPEC_TIMESTAMP)
    # standardwebhooks checks the timestamp against the clock: it gets a fresh one signed alike.
    fresh = int(time.time())
    headers = {**signature.headers(SPEC_SECRET, SPEC_ID, fresh, SPEC_BODY), **change}
    if "webhook-timestamp" in change:
        headers["webhook-timestamp"] = str(fresh - 1)
    with pytest.raises(WebhookVerificationError):
        Webhook(SPEC_SECRET).verify(SPEC_BODY, headers)


def test_an_old_or_future_message_is_refused() -> None:
    headers = signature.headers(SPEC_SECRET, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY)
    for now in (SPEC_TIMESTAMP + 301, SPEC_TIMESTAMP - 301):
        with pytest.raises(signature.WebhookVerificationError, match="too far"):
            signature.verify(SPEC_SECRET, SPEC_BODY, headers, now=now)


def test_a_tampered_body_is_refused() -> None:
    headers = signature.headers(SPEC_SECRET, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY)
    with pytest.raises(signature.WebhookVerificationError, match="no matching"):
        signature.verify(SPEC_SECRET, SPEC_BODY + b" ", headers, now=SPEC_TIMESTAMP)
