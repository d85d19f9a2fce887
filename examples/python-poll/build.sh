#!/usr/bin/env bash
# Builds poll.wasm from app.py with componentize-py (pip install componentize-py==0.25.1).
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p build
componentize-py -d ../../wit/v1 -w plugin componentize app -o build/poll.wasm
echo "built $(pwd)/build/poll.wasm"
