#!/usr/bin/env bash
# Print the path of a working pythonX.Y (PATH first, then pyenv's versions); exit 1 if none.
set -u
v=$1
for cand in "$(command -v "python$v" 2>/dev/null)" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/"python$v" /usr/bin/"python$v"; do
  [ -n "$cand" ] && [ -x "$cand" ] && "$cand" -c 'import sys' 2>/dev/null && { echo "$cand"; exit 0; }
done
exit 1
