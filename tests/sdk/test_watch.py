"""Following a job: the live panel's sparkline (the loss history squeezed into a fixed width, lowest
to highest block), piped progress lines (one per change, a heartbeat, rate and time left) and how
numbers and sizes are written."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from relay.cli.watch import LossPanel, sparkline
from relay.formatting import duration_text, number_text, size_text
from relay.http_client import Client
from relay.progress import ProgressReport, Rate
from relay.sft.job import Event, FineTuneJob


def test_sparkline_spans_the_blocks_from_lowest_to_highest() -> None:
    assert sparkline([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], 8) == "▁▂▃▄▅▆▇█"
    assert sparkline([5.0, 1.0], 10) == "█▁"  # shorter than the width: one cell a value


def test_a_long_history_is_squeezed_into_means_of_equal_runs() -> None:
    # Runs of two: means 1, 3, 5, 7, scaled from 1 to 7.
    assert sparkline([0.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, 8.0], 4) == "▁▃▆█"


def test_flat_empty_and_non_finite_values() -> None:
    assert sparkline([0.3, 0.3, 0.3], 5) == "▁▁▁"
    assert sparkline([], 5) == "" and sparkline([1.0], 0) == ""
    assert sparkline([float("nan"), 1.0, float("inf"), 2.0], 5) == "▁█"


class Clock:
    """Time that moves only when the test says so: the report's rules are about intervals, and a
    test that slept through them would take minutes and still race."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_piped_progress_prints_a_line_per_change_and_a_heartbeat_with_rate_and_time_left() -> None:
    stream, clock = io.StringIO(), Clock()
    report = ProgressReport("ft-1 running", 100, stream=stream, every=5, clock=clock)
    # Polled every second; the step moves 10 at a time, every 20 s (a metrics window of slow steps).
    for second in range(61):
        clock.now = float(second)
        report.update(10 * (second // 20), f"loss {number_text(1 / (second // 20 + 1) / 3)}")
    report.close()
    lines = stream.getvalue().splitlines()
    # A line at once, a heartbeat every 10 s while the step stays, a line at each change: 7, not 61.
    assert [line.split("  ")[1] for line in lines] == [
        "step 0/100",
        "step 0/100",
        "step 10/100",
        "step 10/100",
        "step 20/100",
        "step 20/100",
        "step 30/100",
    ]
    # The rate is measured from the first move of the step (the wait before it does not count).
    assert lines[0].endswith("- steps/s  0s") and lines[2].endswith("- steps/s  20s")
    assert lines[4] == "ft-1 running  step 20/100  loss 0.1111  0.5 steps/s, 2m40s left  40s"
    assert lines[6] == "ft-1 running  step 30/100  loss 0.08333  0.5 steps/s, 2m20s left  1m00s"


def test_a_line_for_a_change_waits_for_the_interval_and_the_last_step_always_shows() -> None:
    stream, clock = io.StringIO(), Clock()
    report = ProgressReport("training", 50, stream=stream, every=5, clock=clock)
    for step in range(0, 51, 10):  # a change every second: one line per 5 s, then the end
        clock.now = step / 10
        report.update(step)
    report.close()
    assert [line.split("  ")[1] for line in stream.getvalue().splitlines()] == ["step 0/50", "step 50/50"]
    assert stream.getvalue().splitlines()[-1].endswith("10 steps/s  5s")


def test_numbers_and_sizes_read_the_same_everywhere() -> None:
    assert [number_text(v) for v in (0.123456789, 2e-3, 2.5e-5, 1234.5678, None)] == [
        "0.1235",
        "0.002",
        "2.5e-05",
        "1235",
        "-",
    ]
    assert [size_text(n) for n in (999, 1000, 2_048_000, 1_999_960, 68_719_476_736)] == [
        "999 B",
        "1.0 kB",
        "2.0 MB",
        "2.0 MB",
        "68.7 GB",
    ]


def job_record(status: str, step: int) -> FineTuneJob:
    fields = {"id": "ft-1", "status": status, "step": step, "steps": 100, "loss": None}
    return FineTuneJob(fields, client=Client("http://127.0.0.1:9", "unused"))


def test_the_live_panel_takes_the_status_the_api_reports_and_keeps_an_end_it_saw() -> None:
    panel = LossPanel(job_record("queued", 0))
    panel.update_from(job_record("running", 4))  # running, before its first metrics event
    screen = io.StringIO()
    Console(width=100, file=screen).print(panel)
    assert "ft-1 running" in screen.getvalue() and "step 4/100" in screen.getvalue()
    panel.add(Event.from_api({"id": 9, "step": 100, "event": "finished"}))
    panel.update_from(job_record("running", 100))  # a refresh that left before the end arrived
    assert panel.status == "completed"


def test_the_time_left_follows_the_recent_pace_not_the_whole_runs() -> None:
    """A run that trained at 5 steps/s for 100 s and now does 0.2 (a machine that got busy): the
    time left is at 0.2 steps/s, the last minute's pace (once said 38 s left at a whole-run 4.34
    steps/s while doing 0.22)."""
    rate = Rate()
    step, now = 0, 0.0
    rate.add(step, now)
    while now < 100:
        now += 1
        step += 5
        rate.add(step, now)
    while now < 200:
        now += 5
        step += 1
        rate.add(step, now)
    assert rate.per_second() == pytest.approx(0.2)
    assert rate.text(step, 1000) == f"0.2 steps/s, {duration_text((1000 - step) / 0.2)} left"
