#!/usr/bin/env bash
# Builds both example plugins: Python (componentize-py) and JavaScript (componentize-js).
set -euo pipefail
cd "$(dirname "$0")"
bash python-poll/build.sh
bash js-location/build.sh
