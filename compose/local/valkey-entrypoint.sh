#!/bin/sh
# As the official image's entrypoint does: Valkey in its own container listens without protected mode
# (only the stack's Docker networks and the port published on the host's 127.0.0.1 reach it); then
# the clock wrapper (libfaketime only when the clock nemesis asks for it).
set -eu
if [ "${1:-}" = valkey-server ]; then
  shift
  set -- valkey-server --protected-mode no "$@"
fi
exec fencelab-faketime "$@"
