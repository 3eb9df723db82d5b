import itertools
import math

import pytest

from relay_engine.core.schedule import learning_rate, warmup_steps


def test_warmup_is_a_tenth_of_the_steps_at_most_200() -> None:
    assert warmup_steps(100) == 10
    assert warmup_steps(2000) == 200
    assert warmup_steps(6000) == 200
    assert warmup_steps(5) == 0


def test_warmup_rises_linearly_to_the_peak() -> None:
    rates = [learning_rate(s, 100, 1.0) for s in range(10)]
    assert rates == pytest.approx([(s + 1) / 10 for s in range(10)])


def test_cosine_decays_from_the_peak_towards_zero_at_the_end() -> None:
    total, peak = 6000, 2.5e-5
    assert learning_rate(200, total, peak) == pytest.approx(peak)
    middle = 200 + (total - 200) // 2
    assert learning_rate(middle, total, peak) == pytest.approx(peak / 2)
    last = learning_rate(total - 1, total, peak)
    assert 0 < last < peak * 1e-6
    rates = [learning_rate(s, total, peak) for s in range(200, total)]
    assert all(a >= b for a, b in itertools.pairwise(rates))
    assert math.isclose(rates[0], peak)


def test_a_step_outside_the_run_is_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        learning_rate(10, 10, 1.0)
