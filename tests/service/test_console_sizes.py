"""The console writes sizes as the CLI does: its bytes() (console/static/js/dom.js), run by Node,
against relay.formatting.size_text on the same counts."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from relay.formatting import size_text

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
