"""Probes of the verification matrix (contract section 12) that are rules rather than races.

Rows 1, 2 (keys), 5 (TTL, lifetime, deadlines), 6 (every field must match),
8 (idempotent retries of every mutation), 9 (scope) and 13 (admin authority,
reason, audit) are best shown by the server's own rule tests; these probes
show them again against the live system, through its HTTP API, with the
results in the history and a checker that can fail. Key derivation is
checked against the contract's formula computed independently
(`lab.scenarios.faults.contract_lock_key`).
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any, Mapping

from checkers.core import Violations
from lab.scenarios.faults import IDENTITY_ORDER, contract_lock_key
from lab.scenarios.scenario import Scenario, Script, Tagged, code, describe, idx, ok, val

LOST = "lease_lost"
API = "/api/v1/target-leases"


def _expect_refused(v: Violations, p, codes: tuple[str, ...], what: str) -> bool:
    """A probe that must be refused with one of `codes`; True when it was (definitely)."""
    if p is None:
        return False
    if ok(p):
        v.add("accepted", idx(p), f"{what} was accepted ({describe(p)})")
        return False
    if p.type == "fail" and code(p) not in codes:
        v.add("wrong-code", idx(p), f"{what} was refused with {code(p)}, not {' / '.join(codes)}")
        return False
    return p.type == "fail"


# -- rows 1, 2: keys ----------------------------------------------------------------------------------
#
# The contract fixes what a key is (C1-C4), not one server's canonical form: C2 asks for "a documented case
# rule", so a server may fold case, keep it, trim spaces or refuse them. The probe therefore learns the
# server's rule from its own answers (the stored tuple it returns, C4; whether an inspect finds the held lease)
# and holds it to consistency: a spelling the server treats as the held identity must be that lease (acquiring
# it conflicts), one it treats as another identity must be another key; never to our server's choices.

# Inputs the contract itself rules out (C1, C2): path syntax, control characters, an operation class outside
# any enum, and a component no bound admits. Our server's extra rules (format characters, backslashes, inner
# spaces, its 64/128-character limits) are choices the contract leaves open: they are not probed.
NON_CANONICAL = {
    "path-slash": {"target_id": "a/b"}, "path-dotdot": {"target_id": ".."},
    "control-nul": {"target_id": "bad\x00nul"}, "control-tab": {"target_id": "tab\there"},
    "control-newline": {"workflow_name": "wf\nx"},
    "unknown-operation-class": {"operation_class": "no-such-class-0"},
    "unbounded-length": {"target_id": "x" * 20_000},
}
# refused: the contract's code for a bad request, or the scope check that comes before it (section 10);
# the unbounded component may also be stopped by a body limit (any definite refusal)
REFUSAL_CODES = ("invalid_lease_request", "access_denied")
ANY_REFUSAL = frozenset({"unbounded-length"})


def identity_script(s: Script) -> Any:
    """Spellings of one held identity; inputs the contract rejects; identities differing in one component each."""
    wf = s.test.extra["identity"]["workflow"]
    target = f"Caf\u00e9-{s.nonce}"
    canonical = {"tenant_id": "tenant-a", "program_id": "program-1", "target_namespace": "fencelab",
                 "target_id": target, "actor_name": "actor-1", "workflow_name": wf, "operation_class": "default"}
    variants = [{"tenant_id": "Tenant-A"}, {"program_id": "PROGRAM-1"}, {"target_id": f"Cafe\u0301-{s.nonce}"},
                {"actor_name": "ACTOR-1", "workflow_name": wf.upper()}, {"operation_class": "DEFAULT"},
                {"target_namespace": "FenceLab"}, {"target_id": f" {target} "}, {"target_id": target.upper()}]
    parts = [s.on(0, s.op("acquire", "k0", "canon-acquire", slot="base", ttl_ms=10000, identity=canonical,
                          expect=canonical))]
    for i, var in enumerate(variants):
        ident = dict(canonical, **var)
        # its own history key: whether it is k0's identity is the server's rule, which the domain checkers
        # (one key, one identity) must not presume; the probe's checker compares it with k0's lease
        parts += [s.on(0, s.op("inspect", f"v{i}", f"canon-inspect-{i}", identity=ident)),
                  s.on(1, s.op("acquire", f"v{i}", f"canon-acquire-{i}", slot=f"v{i}", ttl_ms=2000, identity=ident,
                               expect=ident))]
    for i, (name, bad) in enumerate(NON_CANONICAL.items()):
        parts.append(s.on(0, s.op("acquire", f"bad{i}", f"bad-{name}", slot=f"bad{i}", ttl_ms=2000,
                                  identity=dict(canonical, **bad))))
    base = dict(canonical, target_id=f"Host-{s.nonce}")
    # each differs from `base` in one component by more than case, Unicode form or spaces: under any case rule
    changes = [("target_namespace", "fencelab2"), ("target_id", f"Host-{s.nonce}-2"), ("workflow_name", wf + "x"),
               ("operation_class", "scan")]
    if s.local:  # other tenants, programs and actors need a principal whose scope covers them
        changes += [("tenant_id", "tenant-b"), ("program_id", "program-2"), ("actor_name", "actor-2")]
    who = {"as": "wildcard"} if s.local else {}
    distinct = [("base", base)] + [(f, dict(base, **{f: x})) for f, x in changes]
    parts.append(s.together(*(s.on(i % s.test.concurrency,
                                   s.op("acquire", f"d{i}", f"distinct-{f}", slot=f"d{i}", ttl_ms=10000,
                                        identity=ident, expect=ident, **who))
                              for i, (f, ident) in enumerate(distinct))))
    return s.steps(*parts)


def _fold(text: str) -> str:
    """A component up to case, Unicode form and surrounding whitespace: what any documented rule may change."""
    return unicodedata.normalize("NFKC", str(text)).strip().casefold()


def _key_matches_tuple(v: Violations, p, what: str) -> bool:
    """C3 on what the server reported: its lock key is the contract's formula over its own stored tuple."""
    stored, key = val(p, "stored_identity"), val(p, "lock_key")
    if not isinstance(stored, dict) or key is None:
        return False

    if any(n not in stored for n in IDENTITY_ORDER):
        v.add("tuple-incomplete", idx(p), f"{what}: the stored tuple lacks {[n for n in IDENTITY_ORDER if n not in stored]}"
              " (C4: the record carries the full tuple)")
        return False
    if key != contract_lock_key(stored):
        v.add("key-derivation", idx(p), f"{what}: lock key {key!r} is not the contract's C3 value for the stored "
              f"tuple {[stored[n] for n in IDENTITY_ORDER]!r}")
    return True


def _tuple_is_request(v: Violations, p, requested: Mapping[str, str], what: str) -> None:
    """C4: the stored tuple is the requested identity, up to what a case / Unicode / whitespace rule may change."""
    stored = val(p, "stored_identity")
    if not isinstance(stored, dict):
        return
    off = [n for n, x in requested.items() if n in stored and _fold(stored[n]) != _fold(x)]
    if off:
        v.add("tuple-not-requested", idx(p), f"{what}: the stored tuple's {', '.join(off)} "
              f"({', '.join(repr(stored[n]) for n in off)}) is not the requested identity's")


def _found(p) -> str | None:
    """The lease id of the active lease an inspect found ('' for none); None when it gave no usable answer."""
    if not ok(p):
        return None
    if not isinstance(p.result, dict) or p.result.get("state", "active") != "active":
        return ""  # no record, or a terminal one: nothing of this spelling is held
    return p.result.get("lease_id", "")


def identity_check(t: Tagged, v: Violations, test: Mapping) -> dict[str, Any]:
    """One key per canonical identity under the server's own (consistent) rule; contract-invalid input refused."""
    base = t.one("canon-acquire")
    same = other = reported = 0
    if ok(base):
        reported += _key_matches_tuple(v, base, "canon-acquire")
        _tuple_is_request(v, base, base.value["expect"], "canon-acquire")
        held, held_tuple = val(base, "lease_id"), val(base, "stored_identity")
        for tag, insp in t.starting("canon-inspect-"):
            i = tag.rsplit("-", 1)[1]
            acq = t.one(f"canon-acquire-{i}")
            found = _found(insp)
            if found:  # this spelling names a held lease (the base's, or an earlier spelling's): one key, one lease
                same += found == held
                if found == held:
                    if held_tuple is not None and val(insp, "stored_identity") not in (None, held_tuple):
                        v.add("tuple-changed", idx(base, insp), f"{tag}: inspect shows the held lease with the "
                              f"tuple {val(insp, 'stored_identity')!r}, not the stored {held_tuple!r}")
                    if val(insp, "lock_key") is not None and val(base, "lock_key") is not None \
                            and val(insp, "lock_key") != val(base, "lock_key"):
                        v.add("variant-not-same-key", idx(base, insp), f"{tag}: the held lease is shown with lock "
                              f"key {val(insp, 'lock_key')!r}, not {val(base, 'lock_key')!r}")
                if ok(acq):
                    v.add("one-identity-two-leases", idx(insp, acq), f"{tag}: this spelling finds the held lease "
                          f"{found}, yet acquiring it while held succeeded (lease {val(acq, 'lease_id')}): two "
                          "leases for one canonical identity (C3, C11)")
            elif found == "":  # the server's rule makes this spelling another identity: it must be another key
                if acq is not None and acq.type == "fail" and code(acq) == "lease_conflict":
                    v.add("inconsistent-rule", idx(insp, acq), f"{tag}: inspect finds no lease for this spelling, "
                          "yet acquiring it conflicts with a held lease: inspect and acquire apply different rules")
                elif ok(acq):
                    other += 1
                    reported += _key_matches_tuple(v, acq, f"canon-acquire-{i}")
                    _tuple_is_request(v, acq, acq.value["expect"], f"canon-acquire-{i}")
                    if held_tuple is not None and val(acq, "stored_identity") == held_tuple:
                        v.add("one-identity-two-leases", idx(base, acq), f"canon-acquire-{i}: a second lease was "
                              f"granted for the stored tuple {held_tuple!r} while it was held")
                    elif val(acq, "lock_key") is not None and val(acq, "lock_key") == val(base, "lock_key"):
                        v.add("one-identity-two-leases", idx(base, acq), f"canon-acquire-{i}: a second lease was "
                              f"granted under the held lock key {val(base, 'lock_key')!r}")
            elif insp is not None and insp.type == "fail" and code(insp) == "invalid_lease_request" and ok(acq):
                v.add("inconsistent-rule", idx(insp, acq), f"{tag}: inspect rejects this spelling as invalid, yet "
                      "acquire accepted it")
    refused = 0
    for tag, p in t.starting("bad-"):
        name = tag[len("bad-"):]
        if name in ANY_REFUSAL:
            if ok(p):
                v.add("accepted", idx(p), f"{tag}: an identity component of 20,000 characters was accepted "
                      "(C2: bounded length)")
            refused += p.type == "fail"
        else:
            refused += _expect_refused(v, p, REFUSAL_CODES, f"{tag}: input the contract rules out (C1, C2)")
    keys: dict[str, str] = {}
    leases: dict[str, str] = {}
    tuples: dict[str, str] = {}
    for tag, p in t.starting("distinct-"):
        if p.type == "fail" and code(p) == "lease_conflict":
            v.add("collision", idx(p), f"{tag}: an identity differing in one component conflicts with another "
                  "(C3: any difference in any component gives a different key)")
        if not ok(p):
            continue
        reported += _key_matches_tuple(v, p, tag)
        _tuple_is_request(v, p, p.value["expect"], tag)
        key, lease = val(p, "lock_key"), val(p, "lease_id")
        for mark, seen, label in ((key, keys, "lock key"), (lease, leases, "lease id"),
                                  (json_key(val(p, "stored_identity")), tuples, "stored tuple")):
            if mark is None:
                continue
            if mark in seen:
                v.add("collision", idx(p), f"{tag} and {seen[mark]} share the {label} {mark!r}")
            seen[mark] = tag
    distinct_ok = sum(1 for _, p in t.starting("distinct-") if ok(p))
    return {"spellings_same_lease": same, "spellings_other_identity": other, "non_canonical_refused": refused,
            "distinct_acquired": distinct_ok, "keys_checked_against_c3": reported,
            "exercised": ok(base) and refused > 0 and distinct_ok > 1 and (same + other) > 0,
            "why_not": "the held acquire, the refusals, the spellings or the distinct identities did not run"}


def json_key(d: Any) -> str | None:
    """A hashable form of a reported tuple (None when none was reported)."""
    return json.dumps(d, sort_keys=True) if isinstance(d, dict) else None


IDENTITY = Scenario(
    name="identity-probe", race="matrix rows 1-2: canonical inputs give one key; identities never collide",
    tags=("canon-acquire", "canon-inspect", "distinct", *(f"bad-{n}" for n in NON_CANONICAL)),
    requires="canonical inputs give one key; non-canonical ones are rejected; identities that differ in any "
             "component never collide", rules=("C1", "C2", "C3", "C4"),
    setup="Acquires an identity with a non-ASCII target, then inspects and acquires it through other spellings "
          "(case of each field, NFD for NFC, surrounding spaces); sends identities the contract rules out (path "
          "syntax, control characters, an unknown operation class, a 20,000-character component); acquires, at "
          "once, identities that each differ from one base in one component by more than case, form or spaces "
          "(on the lab's stack all seven, as the all-scopes principal; against another system the four its key's "
          "scope allows).",
    checks="Holds the server to the contract, not to our server's case rule: each spelling is either the held "
           "identity (inspect finds the held lease, acquiring it conflicts) or another one (not found, acquired "
           "as its own key), never both, never a second lease for the held stored tuple or lock key; every "
           "reported lock key is the contract's C3 formula (computed here with hashlib) over the server's own "
           "stored tuple, which matches the request up to case, Unicode form and spaces (C4); the ruled-out "
           "inputs are refused (invalid_lease_request, or access_denied by the scope check before it); the "
           "distinct identities all acquire, with pairwise different keys, lease ids and tuples.",
    script=identity_script, check=identity_check, options={"concurrency": 2, "time_limit": 1.0, "ttl_ms": 2000},
    min_concurrency=2,
)


# -- row 5: TTL, lifetime, deadlines --------------------------------------------------------------


def lifetime_script(s: Script) -> Any:
    """TTLs outside the bounds; renewals against a maximum lifetime; a past and a missing deadline."""
    renews = []
    for i in range(7):
        renews += [s.op("renew", "k1", f"life-renew-{i}", slot="L"), s.sleep(0.15)]
    return s.steps(
        s.on(0, s.op("acquire", "k0", "ttl-low", slot="x", ttl_ms=1),
             s.op("acquire", "k0", "ttl-high", slot="y", ttl_ms=1_000_000_000)),
        s.on(0, s.op("acquire", "k1", "life-acquire", slot="L", ttl_ms=300, max_lifetime_ms=700)),
        s.on(0, *renews),
        s.on(0, s.op("raw", "k2", "deadline-past", path=API + "/acquire", fields={"ttl_ms": 1000}, deadline="past"),
             s.op("raw", "k2", "deadline-missing", path=API + "/acquire", fields={"ttl_ms": 1000}, deadline="omit")))


def lifetime_check(t: Tagged, v: Violations, test: Mapping) -> dict[str, Any]:
    """TTL bounds enforced; no grant past the maximum lifetime; renew after it lost; deadlines finite and enforced."""
    _expect_refused(v, t.one("ttl-low"), ("invalid_lease_request",), "an acquire with ttl_ms 1")
    _expect_refused(v, t.one("ttl-high"), ("invalid_lease_request",), "an acquire with ttl_ms 10^9")
    acq = t.one("life-acquire")
    grants = lost_after = 0
    if ok(acq):
        cap = val(acq, "acquired_at_ms") + 700
        for p in [acq] + [p for _, p in t.starting("life-renew-")]:
            if ok(p):
                grants += 1
                if val(p, "expires_at_ms") > cap:
                    v.add("lifetime-exceeded", idx(acq, p), f"{p.f} granted until {val(p, 'expires_at_ms')} ms, past "
                          f"acquired_at + maximum_lifetime_ms = {cap} ms")
            elif p.type == "fail" and (val(p, "sent_at_ms") or 0) > cap + 20:
                lost_after += 1
                if code(p) != LOST:
                    v.add("wrong-code", idx(p), f"a renew after the maximum lifetime answered {code(p)}, "
                          "not lease_lost")
    _expect_refused(v, t.one("deadline-past"), ("deadline_exceeded",), "an acquire whose deadline_at has passed")
    _expect_refused(v, t.one("deadline-missing"), ("invalid_lease_request",), "an acquire without deadline_at")
    return {"grants_within_lifetime": grants, "renews_refused_after_lifetime": lost_after,
            "exercised": grants > 1 and lost_after > 0, "why_not": "the lease was not renewed up to its lifetime"}


LIFETIME = Scenario(
    name="lifetime-probe", race="matrix row 5: TTL, maximum lifetime, backend time and finite deadlines",
    tags=("deadline-missing", "deadline-past", "life-acquire", "life-renew", "ttl-high", "ttl-low"),
    requires="TTL, maximum lifetime, backend time and finite deadlines hold", rules=("C6", "C20", "C21", "C22", "C23"),
    setup="Acquires with ttl_ms 1 and 10^9; acquires with a 300 ms TTL and a 700 ms maximum lifetime and renews "
          "every 150 ms until past the lifetime; sends a raw acquire whose deadline_at has passed and one without "
          "deadline_at. Every op carries a deadline, which the deadlines checker holds the answers to.",
    checks="TTLs out of bounds are invalid_lease_request; no grant (acquire or renew) expires after acquired_at + "
           "maximum_lifetime_ms; a renew after the lifetime is lease_lost; a past deadline is deadline_exceeded, a "
           "missing one invalid_lease_request; every answer came within its deadline (deadlines checker).",
    script=lifetime_script, check=lifetime_check, options={"concurrency": 1, "time_limit": 1.5, "ttl_ms": 300},
    domain=("fencing", "lease-state", "idempotency", "deadlines"),
)


# -- row 6: every field must match -----------------------------------------------------------------

MISMATCHES = {
    "wrong-token": {"lease": {"fencing_token_delta": 1}},
    "wrong-lease-id": {"lease": {"lease_id": "00000000-0000-4000-8000-000000000000"}},
    "other-instance": {"owner": "intruder"},
}


def owner_script(s: Script) -> Any:
    """A held lease; renew and release with one field wrong at a time; inspect; the genuine renew."""
    mismatches = dict(MISMATCHES, **{"other-identity": {"identity": {"target_id": f"other-{s.nonce}"}}})
    if s.local:
        mismatches["other-principal"] = {"as": "peer"}
    parts = [s.on(0, s.op("acquire", "k0", "acq", slot="A", ttl_ms=10000))]
    for name, change in mismatches.items():
        parts.append(s.on(0, s.op("renew", "k0", f"renew-{name}", slot="A", **change),
                          s.op("release", "k0", f"release-{name}", slot="A", **change)))
    parts.append(s.on(0, s.op("inspect", "k0", "after"), s.op("renew", "k0", "genuine", slot="A")))
    return s.steps(*parts)


def owner_check(t: Tagged, v: Violations, test: Mapping) -> dict[str, Any]:
    """Each mismatched renew/release is lease_lost; the lease is unchanged; the owner's own renew works."""
    refused = sum(_expect_refused(v, p, (LOST,), f"{tag} (one field not matching)")
                  for tag, p in t.starting("re"))
    acq, after = t.one("acq"), t.one("after")
    if ok(acq) and ok(after):
        same = isinstance(after.result, dict) and all(after.result.get(f) == val(acq, f) for f in
                                                      ("lease_id", "fencing_token", "expires_at_ms", "state"))
        if not same:
            v.add("mutated", idx(acq, after), f"after the refused requests the lease is {after.result!r}, not the "
                  "acquired one")
    genuine = t.one("genuine")
    if genuine is not None and genuine.type == "fail":
        v.add("owner-refused", idx(genuine), f"the owner's own renew failed with {code(genuine)}")
    return {"mismatches_refused": refused, "exercised": refused > 0, "why_not": "no mismatched request was refused"}


OWNER = Scenario(
    name="owner-match-probe", race="matrix row 6: renew and release need every matching field",
    tags=("acq", "after", "genuine", *(f"{op}-{n}" for op in ("renew", "release")
                                            for n in (*MISMATCHES, "other-identity", "other-principal"))),
    requires="renew and release need every matching field", rules=("C12", "C13"),
    setup="Acquires a lease, then renews and releases it with exactly one thing wrong at a time: the fencing "
          "token, the lease id, the service instance (another worker), the identity, and on the lab's stack "
          "another principal of the same scope; inspects; renews as the owner.",
    checks="Every mismatched renew and release is lease_lost; the inspect shows the lease exactly as acquired "
           "(nothing moved); the owner's own renew succeeds.",
    script=owner_script, check=owner_check, options={"concurrency": 1, "time_limit": 1.0, "ttl_ms": 2000},
)


# -- row 8: idempotent retries of every mutation ----------------------------------------------------

RETRIED = ("acquire", "renew", "release", "force-release", "revoke")  # each op's tag; its retry's is <op>-retry


def retries_script(s: Script) -> Any:
    """Each mutation, then the same request again through the other server."""
    parts = []

    def twice(original: dict[str, Any], name: str) -> None:
        """The op through lease-1, then the same request again through lease-2."""
        parts.extend([s.on(0, original), s.on(1, s.again(original, f"{name}-retry"))])

    twice(s.op("acquire", "k0", "acquire", slot="A", ttl_ms=10000), "acquire")
    twice(s.op("renew", "k0", "renew", slot="A", ttl_ms=10000), "renew")
    twice(s.op("release", "k0", "release", slot="A"), "release")
    if s.local:  # admin endings need an operator's credential
        parts.append(s.on(0, s.op("acquire", "k1", "acquire-b", slot="B", ttl_ms=10000)))
        twice(s.op("force-release", "k1", "force-release", slot="B", reason="idempotency probe"), "force-release")
        parts.append(s.on(0, s.op("acquire", "k2", "acquire-c", slot="C", ttl_ms=10000)))
        twice(s.op("revoke", "k2", "revoke", slot="C", reason="idempotency probe", incident_id="INC-42"), "revoke")
        parts.append(s.on(0, *(s.op("observe-backend", k, f"counter-{k}") for k in ("k0", "k1", "k2"))))
    return s.steps(*parts)


def retries_check(t: Tagged, v: Violations, test: Mapping) -> dict[str, Any]:
    """Every retry returns the original result; one token per identity."""
    fields = ("lease_id", "fencing_token", "acquired_at_ms", "renewed_at_ms", "expires_at_ms")
    replayed = 0
    for name in RETRIED:
        orig, retry = t.one(name), t.one(f"{name}-retry")
        if not ok(orig) or retry is None:
            continue
        if not ok(retry):
            v.add("retry-not-idempotent", idx(orig, retry), f"the retry of an ok {name} answered {describe(retry)}")
            continue
        replayed += 1
        diff = [f for f in fields if val(orig, f) != val(retry, f)]
        if diff:
            v.add("replay-different-result", idx(orig, retry), f"the retry of {name} returned other {', '.join(diff)}")
    for tag, p in t.starting("counter-"):
        if ok(p) and val(p, "counter") != 1:
            v.add("tokens-allocated", idx(p), f"{tag}: {val(p, 'counter')} tokens for one acquisition and its retry")
    return {"retries_replayed": replayed, "exercised": replayed > 0, "why_not": "no retry was replayed"}


RETRIES = Scenario(
    name="idempotent-retries", race="matrix row 8: acquire, renew, release, force-release, revoke retries are "
                                     "idempotent",
    tags=("counter", *RETRIED, *(f"{n}-retry" for n in RETRIED)),
    requires="a retry with the same request_id and body returns the original result and mutates nothing",
    rules=("C16", "C17", "C18"),
    setup="Acquire, renew and release (and on the lab's stack force-release and revoke, as the operator "
          "principal) each succeed through lease-1 and are sent again, same request_id and body, through lease-2; "
          "the counters are read from Valkey.",
    checks="Every retry is ok with the original's lease_id, token and times; each identity's counter is 1.",
    script=retries_script, check=retries_check, options={"concurrency": 2, "time_limit": 1.0, "ttl_ms": 2000},
    min_concurrency=2,
)


# -- row 9: scope ---------------------------------------------------------------------------------

RAW_PATTERNS = ({"pattern": "starintel:*"}, {"key": "starintel:target-lease:v1:*"}, {"match": "*"})


def scope_script(s: Script) -> Any:
    """A lease of tenant-a; inspect and list by principals of other scopes; raw key patterns."""
    return s.steps(
        s.on(0, s.op("acquire", "k0", "acq", slot="A", ttl_ms=10000)),
        s.on(0, s.op("inspect", "k0", "x-inspect-id", by_id="A", **{"as": "other-tenant"}),
             s.op("inspect", "k0", "x-inspect-identity", **{"as": "other-tenant"}),
             s.op("list", "k0", "x-list-tenant", **{"as": "other-tenant"}),
             s.op("list", "k0", "x-list-actor", **{"as": "other-actor"}),
             s.op("list", "k0", "own-list"),
             *(s.op("list", "k0", f"pattern-{i}", params=p) for i, p in enumerate(RAW_PATTERNS))))


def scope_check(t: Tagged, v: Violations, test: Mapping) -> dict[str, Any]:
    """Out of scope: not found / denied / not listed; raw patterns refused; no message shows a backend key."""
    acq = t.one("acq")
    if not ok(acq):
        return {"exercised": False, "why_not": "the lease was not acquired"}
    lease = val(acq, "lease_id")
    by_id = t.one("x-inspect-id")
    if by_id is not None and (by_id.result is not None or (by_id.type == "fail" and code(by_id) != "lease_not_found")):
        v.add("crossed-scope", idx(by_id), f"another tenant's inspect by id answered {describe(by_id)} "
              f"{by_id.result!r}, not lease_not_found")
    _expect_refused(v, t.one("x-inspect-identity"), ("access_denied", "lease_not_found"),
                    "another tenant's inspect by identity")
    for tag in ("x-list-tenant", "x-list-actor"):
        p = t.one(tag)
        if ok(p) and any(x.get("lease_id") == lease for x in (p.result or {}).get("leases", [])):
            v.add("crossed-scope", idx(p), f"{tag}: a principal of another scope lists the lease")
    own = t.one("own-list")
    listed = ok(own) and any(x.get("lease_id") == lease for x in (own.result or {}).get("leases", []))
    refused = sum(_expect_refused(v, p, ("invalid_lease_request",), f"{tag}: a list with a raw key pattern")
                  for tag, p in t.starting("pattern-"))
    for p in t.pairs:
        err = p.comp.get("error") if p.comp else None
        msg = err.get("msg") if isinstance(err, dict) else None
        if msg and "starintel:target-lease" in msg:
            v.add("key-exposed", idx(p), f"an error message shows a backend key: {msg!r}")
    return {"own_list_shows_lease": listed, "patterns_refused": refused, "exercised": listed and refused > 0,
            "why_not": "the positive control (the owner lists its lease) or the pattern probes did not run"}


SCOPE = Scenario(
    name="scope-probe", race="matrix row 9: inspect and list never cross scope or expose key patterns",
    tags=("acq", "own-list", "pattern", "x-inspect-id", "x-inspect-identity", "x-list-actor", "x-list-tenant"),
    requires="inspect and list never cross scope or expose key patterns", rules=("C14",),
    setup="A tenant-a principal acquires a lease; a tenant-b principal inspects it by id and by identity and "
          "lists, an actor-2 principal lists, the owner lists (the positive control); lists with raw key-pattern "
          "parameters are sent.",
    checks="Another tenant's inspect by id is lease_not_found and by identity access_denied (or not found); no "
           "other scope lists the lease while its owner does; every raw pattern is invalid_lease_request; no "
           "error message contains a backend key.",
    script=scope_script, check=scope_check, options={"concurrency": 1, "time_limit": 1.0, "ttl_ms": 2000},
    stack_only="it needs principals of several scopes (the lab's demo principals); one --api-key-file gives one",
)


# -- row 13: admin authority, reason, audit --------------------------------------------------------


def admin_script(s: Script) -> Any:
    """Force-release and revoke by principals without authority, without a reason, and properly (audited)."""
    return s.steps(
        s.on(0, s.op("acquire", "k0", "acq-a", slot="A", ttl_ms=10000), s.op("acquire", "k1", "acq-b", slot="B",
                                                                           ttl_ms=10000)),
        s.on(0, s.op("force-release", "k0", "denied-lease", slot="A", reason="probe", **{"as": "self"}),
             s.op("force-release", "k0", "denied-nocap", slot="A", reason="probe", **{"as": "nocap"}),
             s.op("raw", "k0", "no-reason-force", slot="A", path=API + "/{lease_id}/force-release", with_lease=True,
                  **{"as": "force"}),
             s.op("raw", "k1", "no-reason-revoke", slot="B", path=API + "/{lease_id}/revoke", with_lease=True,
                  **{"as": "force"})),
        s.on(0, s.op("force-release", "k0", "force-ok", slot="A", reason="probe: stuck worker")),
        s.on(0, s.op("observe-audit", "k0", "audit-force", slot="A"), s.op("renew", "k0", "after-force", slot="A")),
        s.on(0, s.op("revoke", "k1", "revoke-ok", slot="B", reason="probe: compromised", incident_id="INC-7")),
        s.on(0, s.op("observe-audit", "k1", "audit-revoke", slot="B"), s.op("renew", "k1", "after-revoke", slot="B")))


def admin_check(t: Tagged, v: Violations, test: Mapping) -> dict[str, Any]:
    """Denied without the capability or a reason; ok ones end the lease and are in the audit stream with the reason."""
    _expect_refused(v, t.one("denied-lease"), ("access_denied",), "a force-release by a targets:lease principal")
    _expect_refused(v, t.one("denied-nocap"), ("access_denied",), "a force-release by a principal without capability")
    _expect_refused(v, t.one("no-reason-force"), ("invalid_lease_request",), "a force-release without a reason")
    _expect_refused(v, t.one("no-reason-revoke"), ("invalid_lease_request",), "a revoke without a reason")
    audited = 0
    for name, event, state in (("force", "target_lease_force_release", "released"),
                               ("revoke", "target_lease_revoke", "revoked")):
        done, audit = t.one(f"{name}-ok" if name == "force" else "revoke-ok"), t.one(f"audit-{name}")
        if not ok(done):
            continue
        if val(done, "state") != state:
            v.add("wrong-state", idx(done), f"{name} answered state {val(done, 'state')!r}, not {state!r}")
        reason = done.value.get("reason")
        events = [e for e in (val(audit, "events") or []) if e.get("event_type") == event]
        if ok(audit) and not any(e.get("admin_reason") == reason for e in events):
            v.add("not-audited", idx(done, audit), f"no {event} event with the reason {reason!r} in the audit stream "
                  "after the success was reported")
        elif ok(audit):
            audited += 1
        after = t.one(f"after-{name}")
        _expect_refused(v, after, (LOST,), f"the owner's renew after the {name}")
    return {"audited_endings": audited, "exercised": audited > 0, "why_not": "no admin ending was audited"}


ADMIN = Scenario(
    name="admin-probe",
    tags=("acq", "after-force", "after-revoke", "audit-force", "audit-revoke", "denied-lease", "denied-nocap", "force-ok", "no-reason-force", "no-reason-revoke", "revoke-ok"),
    race="matrix row 13: force-release / revoke need elevated authority, a reason and durable audit",
    requires="force-release / revoke need elevated authority, a reason and durable audit", rules=("C15",),
    setup="Two leases are held; a force-release is tried by the owner's targets:lease principal and by a "
          "principal without capability; force-release and revoke are sent raw without a reason by the "
          "operator; then the operator force-releases one and revokes the other (with an incident id); the "
          "audit stream is read from Valkey; the owner renews.",
    checks="The unauthorized attempts are access_denied, the reasonless ones invalid_lease_request; the ok "
           "endings report released / revoked, the audit stream already holds their event with the reason when "
           "read right after, and the owner's renew is lease_lost.",
    script=admin_script, check=admin_check, options={"concurrency": 1, "time_limit": 1.0, "ttl_ms": 2000},
    stack_only="it needs the operator and no-capability principals and reads the audit stream of the lab's Valkey",
)

PROBES = (IDENTITY, LIFETIME, OWNER, RETRIES, SCOPE, ADMIN)
