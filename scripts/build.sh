#!/usr/bin/env bash
# Configures and builds Brigade (Release) into ./build.
# Usage: scripts/build.sh [TARGET ...]   (default: everything, tests included)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
if [ $# -gt 0 ]; then
  for t in "$@"; do cmake --build build -j"$jobs" --target "$t"; done
else
  cmake --build build -j"$jobs"
fi
