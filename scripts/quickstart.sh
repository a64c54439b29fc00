#!/usr/bin/env bash
# The README's first command: install dependencies, build, prepare the King James
# Bible, train the default recipe (recipes/gpt-kjv.toml, ~5 minutes on 2 cores),
# then print the final val loss and a generated sample.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh brigade
./build/bin/brigade prepare recipes/gpt-kjv.toml
./build/bin/brigade train recipes/gpt-kjv.toml
echo
echo "Try more samples: ./build/bin/brigade generate --ckpt runs/gpt-kjv/checkpoint --prompt \"And the LORD said\""
