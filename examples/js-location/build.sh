#!/usr/bin/env bash
# Builds location.wasm from location.js with componentize-js (npm; pinned in package.json).
# Every optional WASI feature of the JS engine is disabled, so the component imports
# only the contract's log interface.
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -d node_modules ]; then
    npm install --no-audit --no-fund
fi
mkdir -p build
npx --no-install componentize-js location.js \
    --wit ../../wit/v1 --world-name plugin \
    --disable http fetch-event stdio random clocks \
    -o build/location.wasm
echo "built $(pwd)/build/location.wasm"
