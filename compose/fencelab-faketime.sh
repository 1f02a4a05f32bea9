#!/bin/sh
# fencelab-faketime COMMAND [ARG]...: run COMMAND under Debian's libfaketime only when the
# clock nemesis asks for it (FENCELAB_FAKETIME=1); otherwise run it untouched.
#
# Under libfaketime the command reads its wall-clock offset from FENCELAB_CLOCK_FILE on
# every time call (FAKETIME_NO_CACHE=1); the lab rewrites that file in the shared clocks/
# directory (mounted as a directory, so a write-then-rename on the host is seen here).
# Monotonic clocks stay real (FAKETIME_DONT_FAKE_MONOTONIC=1), as in lab/stack/clock.py.
set -eu

lib=${FENCELAB_LIBFAKETIME:-/usr/local/lib/fencelab/libfaketime.so.1}

case "${FENCELAB_FAKETIME:-0}" in
  0) ;;
  1)
    clock=${FENCELAB_CLOCK_FILE:-}
    if [ -z "$clock" ]; then
      echo "fencelab-faketime: FENCELAB_FAKETIME=1 needs FENCELAB_CLOCK_FILE (the offset file under clocks/)" >&2
      exit 2
    fi
    if [ ! -e "$clock" ]; then
      # a Swarm task's clocks/ is its own tmpfs, empty at start: its clock starts at +0 (the lab then writes the
      # file by `docker exec`); noclobber: an offset the lab wrote first is kept
      (set -C; printf '+0\n' > "$clock") 2>/dev/null || true
    fi
    if [ ! -r "$clock" ]; then
      echo "fencelab-faketime: cannot read the clock file $clock (is the clocks/ directory mounted?)" >&2
      exit 2
    fi
    if [ ! -r "$lib" ]; then
      echo "fencelab-faketime: libfaketime not found at $lib" >&2
      exit 2
    fi
    export LD_PRELOAD="$lib" FAKETIME_TIMESTAMP_FILE="$clock" FAKETIME_NO_CACHE=1 FAKETIME_DONT_FAKE_MONOTONIC=1
    ;;
  *)
    echo "fencelab-faketime: FENCELAB_FAKETIME must be 0 or 1, not '${FENCELAB_FAKETIME}'" >&2
    exit 2
    ;;
esac

if [ "$#" -eq 0 ]; then
  echo "fencelab-faketime: no command given" >&2
  exit 2
fi
exec "$@"
