#!/usr/bin/env bash
# Install Relay (SDK, engine and server) into .venv and run the end-to-end demo: the embedded
# server, a synthetic dataset, a pi05-tiny fine-tune through the SDK, the merged weights
# downloaded and a few actions sampled from them. About two minutes on 2 CPU cores; on a slower or
# busy machine it says so after the first steps (RELAY_DEMO_STEPS=500 shortens the run).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e ".[server]"
python examples/demo.py
