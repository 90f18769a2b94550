#!/usr/bin/env bash
# Everything a fresh machine needs: a virtualenv with the package (editable),
# its test/bench/dev extras, and the compiled extensions.
set -euo pipefail
python=${1:-python3}
venv=${2:-.venv}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "Cython==3.3.1" "setuptools>=77" wheel
"$venv/bin/python" -m pip install -q --no-build-isolation -e ".[test,bench,dev]"
