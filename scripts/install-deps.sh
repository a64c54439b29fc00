#!/usr/bin/env bash
# Installs everything Brigade needs on Debian 12 (idempotent: safe to run again).
# Build: compiler, CMake, oneDNN, OpenMP, TOML, CLI11, fmt, JSON, SentencePiece.
# Data: the King James Bible (bible-kjv), Fashion-MNIST (dataset-fashion-mnist). Tests: GoogleTest, and python3-torch
# for the PyTorch cross-checks (fixtures themselves are committed).
set -euo pipefail
pkgs=(
  build-essential cmake pkg-config
  libdnnl-dev ocl-icd-opencl-dev
  libopenmpi-dev openmpi-bin
  libtomlplusplus-dev libcli11-dev libfmt-dev libspdlog-dev nlohmann-json3-dev
  libzstd-dev zlib1g-dev
  libsentencepiece-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  bible-kjv bible-kjv-text dataset-fashion-mnist
  python3-torch python3-numpy
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
