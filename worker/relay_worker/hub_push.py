"""A recipe's ``hub`` block (relay.hub_target.HubTarget): when the job completes, its output and a
model card are pushed to the Hub model repo it names, and a ``pushed`` event (relay.events.PushedEvent)
records the repo, the branch and the commit, or why the push failed.

The push runs on the worker that trained the job (rank 0's host), after the engine returned and
before the job is written completed, so that its event is among the job's when the job ends. A
push that fails never fails the job: the output stays, the event says why, and `relay fine-tunes
push` pushes it later.

The Hub and the token are the worker's environment's, as for the engine's downloads: HF_ENDPOINT
(default https://huggingface.co) and HF_TOKEN, which needs write access to the repo's owner. The
token is never in the job's row, its config, an event or a file (relay.hub_push sends it to the
Hub alone, and scrubs it from messages).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import select

from relay.events import Event, PushedEvent, RecipeResult, parse_known
from relay.hub_push import HubPushError, push_output
from relay.hub_target import DEFAULT_BRANCH, HubTarget
from relay.model_card import CardFacts, facts_of_events, model_card
from relay.sft.config import SFTConfig
from relay_api.event_rows import event_object
from relay_api.models import fine_tune_events, fine_tunes
from relay_worker.lifecycle import Claim

log = logging.getLogger("relay_worker")


def push_after_run(
    db_sessions: Any,
    claim: Claim,
    result: RecipeResult,
    flush: Callable[[], None],
    on_event: Callable[[Event], None],
) -> PushedEvent | None:
    """Push a completed job's output where its recipe's ``hub`` block says, and report a ``pushed``
    event through `on_event`; None (nothing done) without a block. `flush` writes the events
    reported so far, which the card reads back from the database."""
    try:
        config = SFTConfig.parse(claim.config)
    except ValueError:  # the API stored it checked: a config this version refuses is left unpushed
        log.exception("%s: the stored recipe does not parse; its hub block is not pushed", claim.job_id)
        return None
    target = config.hub
    if target is None or result.output_dir is None:
        return None
    revision = target.revision or DEFAULT_BRANCH
    try:
        flush()
        card = model_card(_facts(db_sessions, claim, config), target.repo_id)
        pushed = push_output(
            Path(result.output_dir),
            target.repo_id,
            card=card,
            private=target.private,
            revision=target.revision,
            commit_message=f"Upload Relay fine-tune {claim.job_id}",
        )
        event = PushedEvent(
            step=result.step,
            repo_id=pushed.repo_id,
            revision=pushed.revision,
            private=pushed.private,
            commit=pushed.commit,
            url=pushed.url,
            error=None,
        )
        log.info("%s: pushed to %s at %s, commit %s", claim.job_id, pushed.repo_id, revision, pushed.commit)
    except HubPushError as error:  # the Hub refused or is away: said in one line, token-free
        event = _failed(result.step, target, str(error))
        log.warning("%s: %s", claim.job_id, error)
    # Anything else (the database away while the card's events are read, a card that cannot be
    # made) is a failed push too: a trained job is never failed by its push.
    except Exception as error:
        log.exception("%s: the push to %s failed", claim.job_id, target.repo_id)
        event = _failed(result.step, target, f"{type(error).__name__}: the push could not be made")
    on_event(event)
    return event


def _failed(step: int, target: HubTarget, why: str) -> PushedEvent:
    return PushedEvent(
        step=step,
        repo_id=target.repo_id,
        revision=target.revision or DEFAULT_BRANCH,
        private=target.private,
        commit=None,
        url=None,
        error=why,
    )


def _facts(db_sessions: Any, claim: Claim, config: SFTConfig) -> CardFacts:
    """The card's facts from the job's row (what the engine read: dataset, weights) and its event rows
    of every attempt (validation, eval, the last metrics)."""
    with db_sessions() as db:
        row = db.execute(
            select(fine_tunes.c.dataset, fine_tunes.c.weights).where(fine_tunes.c.id == claim.job_id)
        ).one()
        rows = db.execute(
            select(fine_tune_events)
            .where(fine_tune_events.c.job_id == claim.job_id)
            .order_by(fine_tune_events.c.id)
        ).mappings()
        events = [event for item in rows if (event := parse_known(event_object(item))) is not None]
    facts = facts_of_events(config, events, job_id=claim.job_id)
    return dataclasses.replace(facts, dataset=row.dataset, weights=row.weights)
