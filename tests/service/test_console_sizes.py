"""The console writes sizes and durations as the CLI does: its bytes() and duration()
(console/static/js/dom.js), run by Node, against relay.formatting's size_text and duration_text on
the same values."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from relay.formatting import duration_text, size_text

DOM_JS = Path(__file__).resolve().parents[2] / "api/relay_api/console/static/js/dom.js"
COUNTS = [0, 999, 1000, 1_949_999, 2_048_000, 999_960, 1_999_960, 68_719_476_736]


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js to run the console's module")
def test_the_consoles_sizes_match_the_clis(tmp_path: Path) -> None:
    script = tmp_path / "sizes.mjs"
    script.write_text(
        f'import {{ bytes }} from "{DOM_JS.as_uri()}";\nconsole.log(JSON.stringify({COUNTS}.map(bytes)));\n'
    )
    shown = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(shown.stdout) == [size_text(count) for count in COUNTS]


SECONDS = [0, 0.4, 5, 59.9, 60, 75, 3599, 3600, 3700, 90_061.5]


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js to run the console's module")
def test_the_consoles_durations_match_the_clis(tmp_path: Path) -> None:
    """The results card's elapsed time, ETA and duration read the same on the page and in the CLI."""
    script = tmp_path / "durations.mjs"
    script.write_text(
        f'import {{ duration }} from "{DOM_JS.as_uri()}";\n'
        f"console.log(JSON.stringify({SECONDS}.map(duration)));\n"
    )
    shown = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(shown.stdout) == [duration_text(seconds) for seconds in SECONDS]
