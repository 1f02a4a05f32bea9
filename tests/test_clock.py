"""libfaketime clocks on the real valkey-server: TIME and key expiry follow the offset file."""

from __future__ import annotations

import time

import pytest
import redis

from lab.stack.faketime import FakeClock, faketime_env
from lab.stack.valkey import ValkeyProcess


def wait_for(pred, timeout=3.0):
    """Poll `pred` until it holds or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def test_valkey_clock_jump_expires_keys_early(run_dir):
    clock = FakeClock(run_dir / "clock" / "valkey.rc")
    v = ValkeyProcess(run_dir, env=faketime_env(clock.path)).start()
    try:
        c = redis.Redis.from_url(v.url)
        before, _ = c.time()
        c.set("lease", "x", px=10_000)
        clock.set_offset(20)
        # libfaketime notices a rewritten offset file within a few ms, not at the very next call
        assert wait_for(lambda: c.time()[0] - before >= 19), "Valkey's TIME must follow the offset file"
        assert c.get("lease") is None, "a +20 s jump expires a 10 s key at once"
        clock.reset()
        assert wait_for(lambda: abs(c.time()[0] - time.time()) < 5)
        c.close()
    finally:
        v.stop()


def test_bad_offsets_are_refused(run_dir):
    clock = FakeClock(run_dir / "c.rc")
    for bad in (float("nan"), 1e12, "5"):
        with pytest.raises(ValueError, match="clock offset"):
            clock.set_offset(bad)
    clock.set_offset(-2.5)
    assert clock.offset() == -2.5
