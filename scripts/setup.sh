#!/usr/bin/env bash
# Everything a fresh machine needs: a virtualenv with the package (editable),
# its test/bench/dev extras, and the compiled extensions.
set -euo pipefail
python=${1:-python3}
venv=${2:-.venv}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "Cython==3.3.1" "setuptools>=77" wheel
"$venv/bin/python" -m pip install -q --no-build-isolation -e ".[test,bench,spark,dev]"
# nsqadmin's browser tests drive Debian's chromium through playwright
if ! command -v chromium >/dev/null 2>&1; then
    sudo_=""; [ "$(id -u)" = 0 ] || sudo_="sudo"
    $sudo_ apt-get update -qq && $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
