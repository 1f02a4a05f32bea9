"""Identity, key derivation, settings and principals of the reference lease server (no Valkey needed).

Rules: C1 (the 7-tuple), C2 (validation and normalization), C3 (the lock key),
plus the settings file and the principals file validation.
"""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from hypothesis import given, settings as hsettings
from hypothesis import strategies as st

from lab.server import auth
from lab.server.identity import (
    IDENTITY_FIELDS,
    KEY_PREFIX,
    Identity,
    IdentityError,
    identity_from_canonical_json,
    normalize_identity,
)
from lab.server.settings import Settings, SettingsError, load_settings, settings_from_dict

BASE = {"tenant_id": "tenant-a", "program_id": "program-1", "target_namespace": "dns", "target_id": "example.com",
        "actor_name": "actor-1", "workflow_name": "recon"}

# The documented test vector (docs/server.md).
VECTOR_JSON = '["tenant-a","program-1","dns","example.com","actor-1","recon","default"]'
VECTOR_KEY = "starintel:target-lease:v1:o8CgbnwkR4ayXOl4u4R6NTcjtSjOF1y47WPsajFshhU"
VECTOR2_KEY = "starintel:target-lease:v1:SbTTRax8PRWwz2qDw9BYKuZw7oc-GXsUYLJ9aVkCjB8"


def reference_key(values: list[str]) -> str:
    """An independent implementation of C3 with the standard library only."""
    data = json.dumps(values, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return KEY_PREFIX + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")


def test_c1_identity_is_the_ordered_7_tuple_with_default_operation_class():
    ident = normalize_identity(BASE)
    assert Identity._fields == IDENTITY_FIELDS
    assert tuple(ident) == ("tenant-a", "program-1", "dns", "example.com", "actor-1", "recon", "default")
    assert normalize_identity({**BASE, "operation_class": "default"}) == ident
    assert normalize_identity({**BASE, "operation_class": "scan"}).operation_class == "scan"


def test_c1_operation_class_is_a_closed_enum():
    with pytest.raises(IdentityError) as e:
        normalize_identity({**BASE, "operation_class": "delete-everything"})
    assert e.value.field == "operation_class"


def test_c2_identifiers_are_case_folded_and_nfc_normalized():
    upper = normalize_identity({**BASE, "tenant_id": "Tenant-A", "actor_name": "ACTOR-1", "operation_class": "Scan"})
    assert (upper.tenant_id, upper.actor_name, upper.operation_class) == ("tenant-a", "actor-1", "scan")
    assert upper.lock_key() == normalize_identity({**BASE, "operation_class": "scan"}).lock_key()
    decomposed = normalize_identity({**BASE, "target_id": "Cafe\u0301.example"})
    composed = normalize_identity({**BASE, "target_id": "Caf\u00e9.example"})
    assert decomposed == composed and decomposed.target_id == "Caf\u00e9.example"


def test_c2_target_id_is_case_sensitive():
    a = normalize_identity({**BASE, "target_id": "Host-1"})
    b = normalize_identity({**BASE, "target_id": "host-1"})
    assert a.target_id == "Host-1" and a.lock_key() != b.lock_key()


@pytest.mark.parametrize("field,value", [
    ("tenant_id", "tenant\x00a"),          # control character
    ("workflow_name", "re\ncon"),
    ("target_id", "example.com\x7f"),
    ("target_id", "exa\u200bmple.com"),    # zero-width space (format character)
    ("target_id", "a\u202eb"),             # bidi override
    ("target_id", "a/b"),                  # path syntax
    ("target_id", "a\\b"),
    ("target_id", "../etc"),
    ("program_id", "program/1"),
    ("program_id", ".."),
    ("actor_name", "actor..1"),
    ("target_id", " padded"),
    ("target_id", ""),
    ("tenant_id", ""),
    ("tenant_id", "t" * 65),                # bounded length
    ("target_id", "x" * 129),
    ("target_id", "\u00e9" * 129),
    ("tenant_id", "ténant"),                # identifiers are ASCII
    ("tenant_id", "-leading-dash"),
    ("target_id", "\ud800"),                # lone surrogate: not valid UTF-8
    ("tenant_id", 7),
    ("target_id", None),
])
def test_c2_rejects_what_cannot_be_canonical(field, value):
    with pytest.raises(IdentityError) as e:
        normalize_identity({**BASE, field: value})
    assert e.value.field == field
    assert field in str(e.value)


def test_c2_missing_component_is_named():
    fields = dict(BASE)
    del fields["actor_name"]
    with pytest.raises(IdentityError, match="actor_name: is required"):
        normalize_identity(fields)


def test_c3_key_test_vector():
    ident = normalize_identity(BASE)
    assert ident.canonical_json().decode() == VECTOR_JSON
    assert ident.lock_key() == VECTOR_KEY == reference_key(list(ident))
    other = normalize_identity({**BASE, "tenant_id": "Tenant-A", "target_id": "Cafe\u0301.example",
                                "operation_class": "scan"})
    assert other.canonical_json() == '["tenant-a","program-1","dns","Café.example","actor-1","recon","scan"]'.encode()
    assert other.lock_key() == VECTOR2_KEY == reference_key(list(other))


def test_c3_component_boundaries_matter():
    a = normalize_identity({**BASE, "target_namespace": "dnsx", "target_id": "y"})
    b = normalize_identity({**BASE, "target_namespace": "dns", "target_id": "xy"})
    assert a.lock_key() != b.lock_key()


_ident_text = st.from_regex(r"[a-z0-9][a-z0-9._:@+-]{0,10}", fullmatch=True).filter(lambda s: ".." not in s)
_target_text = st.text(st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Zl", "Zp", "Zs"),
                                     blacklist_characters="/\\"), min_size=1, max_size=20).filter(
    lambda s: ".." not in s)


@hsettings(max_examples=200, deadline=None)
@given(st.lists(_ident_text, min_size=6, max_size=6), _target_text, st.integers(0, 6), _ident_text)
def test_c3_identities_differing_in_any_component_never_collide(parts, target, which, replacement):
    fields = dict(zip([f for f in IDENTITY_FIELDS if f not in ("target_id", "operation_class")], parts[:5]))
    fields.update(target_id=target, operation_class="default")
    a = normalize_identity(fields)
    changed = dict(fields)
    name = IDENTITY_FIELDS[which]
    if name == "operation_class":
        changed[name] = "scan"
    elif name == "target_id":
        changed[name] = target + "x"
    else:
        changed[name] = replacement if replacement != fields[name] else replacement + "x"
    b = normalize_identity(changed)
    assert a != b
    assert a.lock_key() != b.lock_key()
    assert a.lock_key() == reference_key(list(a))
    assert identity_from_canonical_json(a.canonical_json()) == a


def test_c4_stored_identity_must_be_canonical():
    with pytest.raises(ValueError):
        identity_from_canonical_json('["Tenant-A","program-1","dns","example.com","actor-1","recon","default"]')
    with pytest.raises(ValueError):
        identity_from_canonical_json('["tenant-a"]')


# -- settings -------------------------------------------------------------------------

def test_settings_defaults_are_valid_and_consistent():
    s = Settings().validate()
    assert s.min_ttl_ms <= s.max_ttl_ms <= s.max_lifetime_ms
    assert s.idempotency_ttl_ms == s.max_lifetime_ms + s.idempotency_retry_window_ms
    assert s.fence_max == 2**53 - 1


@pytest.mark.parametrize("data,field", [
    ({"no_such_setting": 1}, "no_such_setting"),
    ({"min_ttl_ms": "100"}, "min_ttl_ms"),
    ({"min_ttl_ms": 500, "max_ttl_ms": 400}, "min_ttl_ms"),
    ({"max_ttl_ms": 10_000_000}, "max_ttl_ms"),
    ({"fence_max": 2**60}, "fence_max"),
    ({"max_page_size": 0}, "max_page_size"),
    ({"rate_per_principal": True}, "rate_per_principal"),
    ({"valkey_url": "http://x"}, "valkey_url"),
])
def test_settings_errors_name_the_field(data, field):
    with pytest.raises(SettingsError) as e:
        settings_from_dict(data)
    assert str(e.value).startswith(field)


def test_settings_load_from_file(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"min_ttl_ms": 50, "rate_per_principal_target": 5}))
    s = load_settings(p)
    assert s.min_ttl_ms == 50 and s.rate_per_principal_target == 5.0
    p.write_text("{not json")
    with pytest.raises(SettingsError, match="not valid JSON"):
        load_settings(p)


# -- principals (section 10) ---------------------------------------------------------------

def test_demo_principals_store_only_salted_hashes(tmp_path):
    records, credentials = auth.provision_demo_principals()
    path = auth.write_principals_file(records, tmp_path / "principals.json")
    text = path.read_text()
    assert (path.stat().st_mode & 0o777) == 0o600
    for cred in credentials:
        assert cred["api_key"] not in text
        secret = cred["api_key"].split(".")[2]
        assert secret not in text
    loaded = auth.load_principals(path)
    authenticator = auth.Authenticator(loaded)
    by_id = {c["principal_id"]: c for c in credentials}
    assert {"lease-a1", "lease-a1-p2", "lease-a1-actor2", "lease-b1", "force-a", "admin", "wildcard"} <= set(by_id)
    for cred in credentials:
        p = authenticator.authenticate(f"Bearer {cred['api_key']}")
        assert p is not None and p.principal_id == cred["principal_id"]
        assert sorted(p.capabilities) == sorted(cred["capabilities"])
    # salts differ, so equal keys would still hash differently
    assert len({r["salt"] for r in records}) == len(records)


def test_authentication_refuses_wrong_and_malformed_keys(tmp_path):
    records, credentials = auth.provision_demo_principals()
    a = auth.Authenticator(auth.parse_records(records))
    key = credentials[0]["api_key"]
    forged = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")
    for header in (None, "", "Bearer", f"Basic {key}", f"Bearer {forged}", "Bearer flk.nobody.x",
                   f"Bearer {key.replace('lease-a1-k1', 'admin-k1')}", "Bearer " + "x" * 500):
        assert a.authenticate(header) is None, header
    assert a.authenticate(f"Bearer {key}") is not None
    assert a.authenticate(f"Bearer {key}") is not None  # the cached path


def test_the_key_is_compared_exactly_after_http_whitespace_only(tmp_path):
    """RFC 9110: SP and HTAB around a field value, SP after the (case-insensitive) scheme; no Unicode space."""
    records, credentials = auth.provision_demo_principals()
    a = auth.Authenticator(auth.parse_records(records))
    key = credentials[0]["api_key"]
    for header in (f"Bearer {key}", f" \tBearer {key} \t", f"Bearer   {key}", f"bearer {key}", f"BEARER {key}"):
        assert a.authenticate(header) is not None, repr(header)
    for space in ("\u00a0", "\u0085", "\u2003", "\u3000", "\x0b", "\x0c", "\x1c", "\n", "\r"):
        for header in (f"Bearer {key}{space}", f"Bearer {space}{key}", f"Bearer{space}{key}"):
            assert a.authenticate(header) is None, repr(header)
            assert a.authenticate(f"Bearer {key}") is not None  # (and the cached path does not change that)
    assert a.authenticate(f"Bearer\t{key}") is None  # HTAB is no separator between scheme and key


@pytest.mark.parametrize("mutate,field", [
    (lambda r: r.pop("key_hash"), "principals[0].key_hash"),
    (lambda r: r.update(capabilities=["targets:everything"]), "principals[0].capabilities"),
    (lambda r: r.update(api_key="flk.x.y"), "principals[0].api_key"),
    (lambda r: r.update(salt="zz"), "principals[0].salt"),
    (lambda r: r.update(principal_id="Bad Id"), "principals[0].principal_id"),
    (lambda r: r.update(scopes=[{"tenant": "tenant-a"}]), "principals[0].scopes[0]"),
    (lambda r: r.update(scopes=[{"tenant": "a/b", "program": "*", "actor": "*", "target": "*"}]),
     "principals[0].scopes[0].tenant"),
    (lambda r: r.update(scopes=[{"tenant": "*", "program": "*", "actor": "*", "target": "dns"}]),
     "principals[0].scopes[0].target"),
])
def test_principals_file_errors_name_the_field(tmp_path, mutate, field):
    records, _ = auth.provision_demo_principals()
    mutate(records[0])
    p = tmp_path / "p.json"
    p.write_text(json.dumps({"version": 1, "principals": records}))
    with pytest.raises(auth.PrincipalsError) as e:
        auth.load_principals(p)
    assert str(e.value).startswith(field)


def test_principals_file_rejects_duplicates_and_bad_versions(tmp_path):
    records, _ = auth.provision_demo_principals()
    p = tmp_path / "p.json"
    p.write_text(json.dumps({"version": 1, "principals": [records[0], records[0]]}))
    with pytest.raises(auth.PrincipalsError, match=r"principals\[1\].credential_id: duplicate"):
        auth.load_principals(p)
    p.write_text(json.dumps({"version": 2, "principals": records}))
    with pytest.raises(auth.PrincipalsError, match="version"):
        auth.load_principals(p)


def test_scopes_match_tenant_program_actor_target():
    ident = normalize_identity(BASE)
    scope = lambda **kw: auth.Scope(**{"tenant": "*", "program": "*", "actor": "*", "target": "*", **kw})  # noqa: E731
    assert scope().matches(ident)
    assert scope(tenant="tenant-a", program="program-1", actor="actor-1", target="dns/*").matches(ident)
    assert scope(target="dns/example.com").matches(ident)
    assert not scope(tenant="tenant-b").matches(ident)
    assert not scope(program="program-2").matches(ident)
    assert not scope(actor="actor-2").matches(ident)
    assert not scope(target="ipv4/*").matches(ident)
    assert not scope(target="dns/other.com").matches(ident)
