"""The repository stands alone: no file cites a document outside it (the product's spec or reference
notes that the project was built from); what users need is in docs/, in our own words."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Spelled in pieces so that this file does not match itself.
OUTSIDE = re.compile(r"\.\./" + "shared|/work/" + r"shared|(^|[^a-z_])(spec|reference)/[a-z-]+\." + "md")


def test_no_file_cites_a_path_outside_the_repository() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    citing = []
    for name in filter(None, tracked):
        path = ROOT / name.decode()
        if not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # binary: weights, images, parquet
        citing += [
            f"{name.decode()}:{number}: {line.strip()}"
            for number, line in enumerate(text.splitlines(), 1)
            if OUTSIDE.search(line)
        ]
    assert not citing, "\n".join(citing)


def test_the_docs_shell_examples_run_programs_a_default_system_has() -> None:
    """A command substitution in an example (`$(uuidgen)` once) names a program on this machine's
    PATH (a plain Debian with Python): a reader pasting the example gets no 'command not found'."""
    missing = []
    for path in sorted((ROOT / "docs").rglob("*.md")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for program in re.findall(r"\$\(\s*([A-Za-z0-9_.-]+)", line):
                if shutil.which(program) is None:
                    missing.append(f"{path.relative_to(ROOT)}:{number}: {program}")
    assert not missing, "\n".join(missing)
