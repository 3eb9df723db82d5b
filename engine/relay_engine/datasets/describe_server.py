"""The API's helper process: `python -m relay_engine.datasets.describe_server --serve` answers each
JSON request line on its stdin (`{"name", "revision", "cache_dir"}`) with one JSON line on its stdout,
the dataset's description (`describe_dataset`) or the error, and exits when its stdin closes or after
`--idle-seconds` without a request. The API never imports the engine: it keeps a few of these
processes (relay_api.inspectors) and writes to them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import sys
import traceback
from typing import Any, BinaryIO

from relay_engine.datasets.describe import describe_dataset
from relay_engine.errors import DatasetError, EngineError

# The reason an answer gives for a request it could not answer: a bug, named on stderr with its traceback.
FAILED = "failed"


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """One request (`name`, and optionally `revision` and `cache_dir`) -> `{"dataset": {...}}`, or
    `{"error": {"reason", "message"}}`: a DatasetError's reason, `refused` for another EngineError,
    `failed` for anything else (a bug)."""
    try:
        description = describe_dataset(
            str(request["name"]), revision=request.get("revision"), cache_dir=request.get("cache_dir")
        )
    except DatasetError as error:
        return {"error": {"reason": error.reason, "message": str(error)}}
    except EngineError as error:
        return {"error": {"reason": DatasetError.REFUSED, "message": str(error)}}
    except Exception as error:  # a bug: the request is answered, and the process serves the next one
        traceback.print_exc()
        return {"error": {"reason": FAILED, "message": f"{type(error).__name__}: {error}"}}
    return {"dataset": description.model_dump(mode="json")}


def serve(requests: int, answers: BinaryIO, idle_seconds: float) -> None:
    """Answer each JSON line read from the file descriptor `requests` with one JSON line on
    `answers`, until `requests` closes or nothing comes for `idle_seconds`."""
    pending = b""
    while True:
        while b"\n" not in pending:
            ready, _, _ = select.select([requests], [], [], idle_seconds)
            if not ready:
                return
            chunk = os.read(requests, 1 << 16)
            if not chunk:
                return
            pending += chunk
        line, _, pending = pending.partition(b"\n")
        answers.write(json.dumps(answer(json.loads(line))).encode() + b"\n")
        answers.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m relay_engine.datasets.describe_server",
        description="Answer JSON requests on stdin, one a line, with the datasets' descriptions.",
    )
    parser.add_argument("--serve", action="store_true", required=True)
    parser.add_argument(
        "--idle-seconds", type=float, default=300.0, help="exit after this long without a request"
    )
    args = parser.parse_args(argv)
    # The answers go to the real stdout, and anything else printed (a library's progress) to stderr.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C in the API's terminal reaches this process too
        serve(sys.stdin.fileno(), answers, args.idle_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
