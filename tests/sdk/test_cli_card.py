"""`relay fine-tunes retrieve`'s results card, drawn from a summary as the API answers it: a running
job's ETA, and the validation and closed-loop figures once a job reports them (test_cli.py checks
the card of a real job through the served API)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from relay.cli.fine_tunes import _show_card
from relay.sft.summary import FineTuneSummary, model_use


def running_card(validations: tuple[dict[str, Any], dict[str, Any]]) -> FineTuneSummary:
    """A running job's card whose validation scored `validations` (the figures at steps 1000 and
    2000 that differ between them)."""
    scoring = {"validation_loss": 0.1, "blind_mse": 0.028, "frames": 48, "episodes": 4, "seconds": 0.5}
    at_1000, at_2000 = validations
    return FineTuneSummary.model_validate(
        {
            "id": "ft-0123456789ab",
            "status": "running",
            "step": 2000,
            "steps": 6000,
            "progress": 2000 / 6000,
            "queued_seconds": 4.0,
            "elapsed_seconds": 3725.0,
            "eta_seconds": 8000.0,
            "steps_per_second": 0.52,
            "samples_per_second": 66.5,
            "latest_steps_per_second": 0.5,
            "loss": {
                "first": {"step": 10, "loss": 0.91},
                "last": {"step": 2000, "loss": 0.12},
                "best": {"step": 1990, "loss": 0.11},
            },
            "checkpoints": [
                {
                    "step": 1000,
                    "path": "checkpoints/step-00001000",
                    "kept": False,
                    "loss": 0.2,
                    "seconds": 30.0,
                },
                {
                    "step": 2000,
                    "path": "checkpoints/step-00002000",
                    "kept": True,
                    "loss": 0.12,
                    "validation": {"step": 2000, "blind_mse": 0.028, **at_2000},
                    "eval": {"step": 2000, "success_rate": 0.55},
                },
            ],
            "validation": {
                "best": {**scoring, "step": 1000, **at_1000},
                "last": {**scoring, "step": 2000, **at_2000},
                "scored": 2,
            },
            "eval": {
                "best": {"step": 1000, "success_rate": 0.6},
                "last": {"step": 2000, "success_rate": 0.55},
                "evaluated": 2,
            },
            "use": model_use("ft-0123456789ab", "pi05", "lerobot/pusht_image", "running").model_dump(),
        }
    )


def card_rows(capsys: pytest.CaptureFixture[str], card: FineTuneSummary) -> tuple[list[str], dict[str, str]]:
    """The card as printed: its lines, and its Results rows by key."""
    _show_card(card)
    lines = capsys.readouterr().out.splitlines()
    results = lines[lines.index("Results") + 1 : lines.index("", lines.index("Results"))]
    rows: dict[str, str] = {}
    key = ""
    for line in results:  # a value of several lines goes on under its key
        if line.startswith("  "):
            rows[key] += "\n" + line.strip()
        else:
            key, rows[key] = re.split(r"\s{2,}", line.strip(), maxsplit=1)
    return lines, rows


def checkpoint_cells(lines: list[str]) -> list[list[str]]:
    return [[cell.strip() for cell in line.split("│") if cell.strip()] for line in lines if "│" in line]


def test_a_running_jobs_card_has_its_eta_validation_and_success_rate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    at_1000 = {"mean_action_mse": 0.012, "action_spread": 0.002, "action_mse": 0.014, "chunks": 4}
    at_2000 = {"mean_action_mse": 0.015, "action_spread": 0.002, "action_mse": 0.017, "chunks": 4}
    lines, rows = card_rows(capsys, running_card((at_1000, at_2000)))
    assert rows["progress"] == "2000/6000 steps (33%)"
    assert rows["elapsed"] == "1h02m (queued 4s before)"
    assert rows["ETA"] == "2h13m left at 0.5 steps/s (the last minute)"
    assert rows["pace"] == "0.52 steps/s, 66.5 samples/s (the whole run)"
    assert rows["training loss"] == "first 0.91 (step 10), last 0.12 (step 2000), best 0.11 (step 1990)"
    # The headline is the mean of the chunks: the ratio and the checkpoints' column read it.
    assert rows["validation"] == (
        "best at step 1000: action error 0.012 (mean of 4 chunks) vs blind 0.028 (2.33x better), "
        "one chunk 0.014, spread 0.002, validation loss 0.1, 48 frames of 4 episodes\n"
        "last at step 2000: action error 0.015 (mean of 4 chunks) vs blind 0.028 (1.87x better), "
        "one chunk 0.017, spread 0.002, validation loss 0.1, 48 frames of 4 episodes"
    )
    assert rows["closed loop"] == "success 55% at step 2000 (best 60% at step 1000)"
    assert checkpoint_cells(lines) == [
        ["1000", "0.2", "-", "-", "30 s", "-", "-", "pruned"],
        ["2000", "0.12", "-", "-", "-", "0.015", "55%", "checkpoints/step-00002000/"],
    ]
    text = "\n".join(lines)
    assert "Use this model (the output is written when the job completes)" in text
    assert 'policy = PI05Policy.from_pretrained("ft-0123456789ab")' in text


def test_a_card_of_scorings_from_before_the_mean_of_chunks_reads_their_one_chunk(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Events stored before mean_action_mse have one chunk's error alone: it is their headline.
    lines, rows = card_rows(capsys, running_card(({"action_mse": 0.012}, {"action_mse": 0.015})))
    assert rows["validation"] == (
        "best at step 1000: action error 0.012 (one chunk) vs blind 0.028 (2.33x better), validation "
        "loss 0.1, 48 frames of 4 episodes\n"
        "last at step 2000: action error 0.015 (one chunk) vs blind 0.028 (1.87x better), validation "
        "loss 0.1, 48 frames of 4 episodes"
    )
    assert [row[5] for row in checkpoint_cells(lines)] == ["-", "0.015"]
