#!/usr/bin/env bash
# Everything a fresh machine needs beyond Python 3.11 (with venv and headers), gcc and make:
# a virtualenv with the package (editable), its test/bench/spark/dev extras, and, from
# Debian, the programs some tests drive.
set -euo pipefail
python=${1:-python3}
venv=${2:-.venv}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "Cython==3.3.1" "setuptools>=77" wheel
"$venv/bin/python" -m pip install -q --no-build-isolation -e ".[test,bench,spark,dev]"
# Debian packages, only those missing:
#   chromium                  nsqadmin's browser tests drive it through playwright
#   openjdk-17-jre-headless   the Spark tests (pyspark runs a JVM; Spark 4 needs Java 17+)
#   etcd-server               the coordination engine of cluster mode (etcd 3.4, v3 API):
#                             tests/consistence start it on ephemeral ports
#   iproute2                  `ip`: the multi-host tests' network namespaces (as root)
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
if [ ${#missing[@]} -gt 0 ]; then
    sudo_=""; [ "$(id -u)" = 0 ] || sudo_="sudo"
    $sudo_ apt-get update -qq
    $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
