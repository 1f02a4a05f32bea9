"""Systems under test: the `LeaseSystem` protocol and the registry that plugs an implementation into the lab.

To test a lease implementation, write ONE class with the `LeaseSystem`
methods (`acquire`, `renew`, `release`, `inspect`, `aclose`, plus the
optional `commit` / `force_release` / `revoke` it declares in
`capabilities`), returning the lab's typed `Result` / `Lease`; register it
(`register_sut`, or an entry point in the `fencelab.suts` group, or name it as
`module.path:Factory`) and run with `test.sut = name`. See
docs/plugging-in-a-system.md. Built in: `reference` and `starintel`.
"""

from lab.findings import Finding, FindingsLog, load_findings, static_records
from lab.sut import etcd, valkey_lock  # the built-in adapters, registered below
from lab.sut.protocol import (OPTIONAL_CAPABILITIES, FencedCommit, ForceRelease, LeaseSystem, Revoke, SutError,
                              check_result, check_system)
from lab.sut.registry import (DEFAULT_SUT, ENTRY_POINT_GROUP, FENCING_STYLES, CheckedSystem, PluginError, SutEntry,
                              WorkloadNeeds, api_key_for, get_sut, open_system, register_sut, sut_names, sut_of,
                              unregister_sut)
from lab.sut.validate import validate_test

# the built-in systems beyond `reference` and `starintel` (lab.sut.registry): registered here, at the top of the
# SUT layer, because their modules build on lab.sut.processes, which builds on the registry
register_sut("etcd", etcd.etcd_system, capabilities={"commit"}, check=etcd.check_etcd,
             processes=etcd.etcd_processes, not_claimed=etcd.NOT_CLAIMED, fencing="server", background=False,
             _trusted=True)
# fencing: etcd's fenced commit asks etcd (the lease service) first, then writes through the store's guard (server);
# valkey-lock-fenced's only fence is the store's token guard (store); valkey-lock hands out no token (none).
# background=False: etcd's client is the lab's JSON gateway over httpx (no keep-alive task); redis-py's asyncio
# Lock has no watchdog (it extends only when `extend` is called) and the connection sends nothing uncalled
# trusted built-ins: `valkey-lock`'s leases carry no fencing token (null), which the result check would refuse
register_sut("valkey-lock", valkey_lock.valkey_lock_system, capabilities={"commit"},
             check=valkey_lock.check_valkey_lock, processes=valkey_lock.valkey_processes,
             not_claimed=valkey_lock.NOT_CLAIMED, fencing="none", background=False, _trusted=True)
register_sut("valkey-lock-fenced", valkey_lock.fenced_valkey_lock_system, capabilities={"commit"},
             check=valkey_lock.check_valkey_lock, processes=valkey_lock.valkey_processes,
             not_claimed=valkey_lock.NOT_CLAIMED, fencing="store", background=False, _trusted=True)

__all__ = [
    "DEFAULT_SUT", "ENTRY_POINT_GROUP", "FENCING_STYLES", "OPTIONAL_CAPABILITIES", "CheckedSystem", "FencedCommit",
    "Finding", "FindingsLog", "ForceRelease", "LeaseSystem", "PluginError", "Revoke", "SutEntry", "SutError",
    "api_key_for", "check_result",
    "check_system", "get_sut", "load_findings", "open_system", "register_sut",
    "static_records", "sut_names", "sut_of", "unregister_sut", "validate_test", "WorkloadNeeds",
]
