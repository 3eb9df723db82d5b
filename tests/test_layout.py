"""The SDK must import without the heavy extras: `import relay` pulls in no torch, web or DB code."""

from __future__ import annotations

import subprocess
import sys


def test_sdk_imports_without_heavy_modules() -> None:
    code = (
        "import sys, relay, relay.catalog, relay.cli\n"
        "heavy = {'torch', 'relay_engine', 'relay_api', 'relay_worker', 'sqlalchemy', 'celery', 'fastapi'}\n"
        "loaded = heavy & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_recipe_entry_point_has_both_spellings() -> None:
    import relay.sft
    from relay.sft.train import train

    assert relay.sft.train is train
