#!/usr/bin/env bash
# Set up .venv with actzip (editable) and everything its tests and demo need. Safe to run again.
#
# PyTorch: an existing torch in .venv is kept (e.g. a CUDA build you installed). Otherwise $ACTZIP_TORCH is
# installed first (default torch==2.13.0; pick a CPU or CUDA wheel with pip's usual --index-url if needed).
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv with $($python --version)"
  "$python" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  echo "installing ${ACTZIP_TORCH:-torch==2.13.0}"
  .venv/bin/python -m pip install -q "${ACTZIP_TORCH:-torch==2.13.0}"
fi
.venv/bin/python -m pip install -q -e ".[test,bench]"
# espeak-ng synthesizes the split benchmark's spoken-digits audio; its tests skip (and say why) without it.
if ! command -v espeak-ng >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing espeak-ng (Debian package)"
  apt-get install -y -qq espeak-ng >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq espeak-ng >/dev/null 2>&1; } \
    || echo "espeak-ng could not be installed: the spoken-digits tests will be skipped"
fi
.venv/bin/python -c "import actzip, torch; print(f'actzip {actzip.__version__} on torch {torch.__version__}')"
