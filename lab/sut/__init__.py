"""Systems under test: the `LeaseSystem` protocol and the registry that plugs an implementation into the lab.

To test a lease implementation, write ONE class with the `LeaseSystem`
methods (`acquire`, `renew`, `release`, `inspect`, `aclose`, plus the
optional `commit` / `force_release` / `revoke` it declares in
`capabilities`), returning the lab's typed `Result` / `Lease`; register it
(`register_sut`, or an entry point in the `fencelab.suts` group, or name it as
`module.path:Factory`) and run with `test.sut = name`. See
docs/plugging-in-a-system.md. Built in: `reference` and `starintel`.
"""

from lab.sut.findings import Finding, FindingsLog, load_findings, static_records
from lab.sut.processes import is_external
from lab.sut.protocol import (
    OPTIONAL_CAPABILITIES,
    FencedCommit,
    ForceRelease,
    LeaseSystem,
    Revoke,
    SutError,
    check_result,
    check_system,
)
from lab.sut.registry import (
    DEFAULT_SUT,
    ENTRY_POINT_GROUP,
    CheckedSystem,
    SutEntry,
    WorkloadNeeds,
    api_key_for,
    get_sut,
    open_system,
    register_sut,
    sut_names,
    sut_of,
    unregister_sut,
    validate_test,
)

__all__ = [
    "DEFAULT_SUT", "ENTRY_POINT_GROUP", "OPTIONAL_CAPABILITIES", "CheckedSystem", "FencedCommit", "Finding",
    "FindingsLog", "ForceRelease", "LeaseSystem", "Revoke", "SutEntry", "SutError", "api_key_for", "check_result",
    "check_system", "get_sut", "is_external", "load_findings", "open_system", "register_sut",
    "static_records", "sut_names", "sut_of", "unregister_sut", "validate_test", "WorkloadNeeds",
]
