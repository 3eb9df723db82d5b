"""The live panel's sparkline: the loss history squeezed into a fixed width, lowest to highest block."""

from __future__ import annotations

from relay.cli.watch import sparkline


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
