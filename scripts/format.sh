#!/usr/bin/env bash
# The repository's C++ format, .clang-format, applied by Debian 12's clang-format-14 (pinned: another
# version formats some constructs differently) to every tracked C++ file under src/, tests/ and examples/.
#   bash scripts/format.sh           rewrite the files in place
#   bash scripts/format.sh --check   change nothing; list each file that differs and exit 1 (the test
#                                    command runs this as the CTest test format.clang_format)
# Tables whose hand layout is the point (token lists, enums with aligned comments) sit between
# `// clang-format off` and `// clang-format on`.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=fix
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac
cf="${CLANG_FORMAT:-clang-format-14}"
if ! command -v "$cf" >/dev/null 2>&1; then
  echo "format.sh: $cf not found: install it with 'apt-get install clang-format-14' (scripts/install-deps.sh does)" >&2
  exit 2
fi
# Tracked files when this is a git checkout; otherwise (a source tarball) every C++ file in the three folders.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -- src tests examples | grep -E '\.(h|hpp|cc|cpp|inc)$')
else
  mapfile -t files < <(find src tests examples -type f \( -name '*.h' -o -name '*.hpp' -o -name '*.cc' \
                         -o -name '*.cpp' -o -name '*.inc' \) | sort)
fi
if [ "$mode" = fix ]; then
  printf '%s\0' "${files[@]}" | xargs -0 "$cf" -i --style=file
  echo "format.sh: formatted ${#files[@]} files"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$cf" --style=file --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "format.sh: ${#bad[@]} of ${#files[@]} files differ from .clang-format:" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "run 'bash scripts/format.sh' to fix them (first lines of the difference: $cf --dry-run ${bad[0]})" >&2
  "$cf" --style=file --dry-run "${bad[0]}" 2>&1 | head -20 >&2
  exit 1
fi
echo "format.sh: all ${#files[@]} files match .clang-format"
