#!/usr/bin/env bash
# Installs what the PyTorch peer of bench/gpt_vs_torch.py and bench/vs_torch.py needs on Debian 12
# (idempotent: safe to run again): python3-torch, python3-torchvision (vs_torch's ResNet, ViT and
# Swin peers) and python3-numpy, and libopenblas0-pthread. Debian's python3-torch
# does its fp32 GEMMs through the system libblas.so.3; without OpenBLAS that is the reference BLAS
# (libblas3, ~8 GFLOP/s on one core), so PyTorch's fp32 training would run many times slower than
# it can and any Brigade/PyTorch ratio would be meaningless. Installing libopenblas0-pthread makes
# it the libblas.so.3 alternative (auto mode, higher priority).
#
#   bash scripts/install-bench-deps.sh          install what is missing (root or sudo), then report
#   bash scripts/install-bench-deps.sh --check  install nothing; exit 1 when a package is missing
#
# Either way it says which library libblas.so.3 resolves to, and warns when that is not OpenBLAS
# (an alternative set by hand keeps pointing at the reference BLAS after the install; the command
# to fix it is printed). bench/gpt_vs_torch.py runs the --check form first and also measures the
# peer's fp32 GEMM peak, refusing to print a ratio when it is under 70% of Brigade's.
set -euo pipefail
check=0
case "${1:-}" in
  "") ;;
  --check) check=1 ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac
pkgs=(python3-torch python3-torchvision python3-numpy libopenblas0-pthread)

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "install-bench-deps: not a Debian system (no dpkg-query); install PyTorch with an optimised BLAS by hand"
  exit 0
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$check" -eq 1 ]; then
    echo "install-bench-deps: missing ${missing[*]}; run \`bash scripts/install-bench-deps.sh\` (apt-get, needs root)"
    exit 1
  fi
  echo "install-bench-deps: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
else
  echo "install-bench-deps: all ${#pkgs[@]} packages present (${pkgs[*]})"
fi

# Which BLAS torch will get: the libblas.so.3 alternative for this architecture.
alt=""
for a in /etc/alternatives/libblas.so.3-*; do
  [ -e "$a" ] && alt="$(basename "$a")" && break
done
if [ -z "$alt" ]; then
  echo "install-bench-deps: warning: no libblas.so.3 alternative found; check which BLAS python3-torch loads"
  exit 0
fi
target="$(readlink -f "/etc/alternatives/$alt")"
case "$target" in
  *openblas*) echo "install-bench-deps: libblas.so.3 -> $target (OpenBLAS)" ;;
  *)
    echo "install-bench-deps: warning: libblas.so.3 -> $target, not OpenBLAS: PyTorch's fp32 GEMMs will be slow;" \
         "run \`update-alternatives --auto $alt\` (root) or pick OpenBLAS with \`update-alternatives --config $alt\`"
    ;;
esac
