#!/usr/bin/env bash
# The python of tests/gpu/run.sh's stages: TIDAL_PY_REAL (the interpreter run.sh chose) started
# with TIDAL_PY_LD_LIBRARY_PATH (the library path without the packed build-gpu/lib), and
# tests/gpu/pyenv/sitecustomize.py, which gives the tools it starts TIDAL_TOOL_LD_LIBRARY_PATH.
d=$(cd "$(dirname "$0")" && pwd)
exec env LD_LIBRARY_PATH="${TIDAL_PY_LD_LIBRARY_PATH:-}" TIDAL_TOOL_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" \
  PYTHONPATH="$d/pyenv${PYTHONPATH:+:$PYTHONPATH}" "${TIDAL_PY_REAL:-python3}" "$@"
