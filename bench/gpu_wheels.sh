#!/usr/bin/env bash
# The wheels bench/gpu_check.sh needs on a lent GPU machine, fetched here into .whl/ (git-ignored).
# That machine has Python 3.12 with PyTorch, numpy, safetensors, huggingface-hub, httpx, typer, rich,
# msgpack and pyarrow, and reaches no package registry; Relay's engine also needs these, at the
# versions pyproject.toml pins. Run once here, then carry .whl with the call (64 MiB in all).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir .whl
download() {
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "$@"
}
# Pure Python, or built for CPython 3.12 on x86-64 Linux.
download "pydantic==2.*" "pydantic-core" "annotated-types" "typing-inspection" \
    "transformers==5.24.0" "peft==0.21.2" "gymnasium>=1.1,<2" "farama-notifications" \
    "sqlalchemy>=2.0.30" "filelock>=3.12" "cloudpickle" "typing-extensions>=4.14"
# pydantic pins the pydantic-core it was built against: keep the pair pip chose for pydantic.
core=$(unzip -p .whl/pydantic-2*.whl '*/METADATA' | sed -n 's/^Requires-Dist: pydantic-core==\([0-9.]*\).*/\1/p')
rm -f .whl/pydantic_core-*.whl
download "pydantic-core==${core}"
du -sh .whl
ls .whl
