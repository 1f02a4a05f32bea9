"""The OpenAPI 3.1 description of the wire API (served at GET /openapi.json).

Written by hand from the contract (section 13) rather than generated, because
the contract, not the code, is the source of truth for the envelopes and codes;
a test checks that every route of the app is described here and that
docs/openapi.json equals what the server serves. Regenerate the file with
`python -m lab.server.openapi docs/openapi.json`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from lab.server.errors import COMMIT_ACCEPTED, HTTP_STATUS, LEASE_SUCCESS_CODES, SUCCESS_CODES
from lab.server.identity import IDENTITY_FIELDS, OPERATION_CLASSES
from lab.server.settings import JSON_SAFE_MAX, Settings
from lab.server.wire import KEY_SHAPE_RE

_ID = {"type": "string", "pattern": r"^[A-Za-z0-9._:@+-]{1,128}$", "minLength": 1, "maxLength": 128}
# the bounds below are the ones lab/server/wire.py and identity.py enforce, so a schema fuzzer reaches valid requests
_IDENTIFIER = {"type": "string", "minLength": 1, "maxLength": 64,
               "pattern": r"^[A-Za-z0-9](?:[A-Za-z0-9_:@+-]|\.(?!\.))*$",
               "description": "case-insensitive (lowercased); ASCII letters, digits and . _ : @ + -, no '..'"}
_TARGET_ID = {"type": "string", "minLength": 1, "maxLength": 128,
              "pattern": r"^(?!\s)(?!.*\s$)(?!.*\.\.)[^/\\\u0000-\u001f\u007f-\u009f\u2028\u2029]+$",
              "description": "case-sensitive NFC text, at most 256 UTF-8 bytes; no control or format characters, "
                             "'/', '\\\\', '..', nor leading or trailing whitespace"}
# RFC 3339 date-time (the server's own parser, wire.rfc3339_ms, takes exactly this)
_RFC3339 = (r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)"
            r"(\.[0-9]{1,9})?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])")
_TOKEN = {"type": "integer", "minimum": 1, "maximum": JSON_SAFE_MAX}
_DEADLINE = {"oneOf": [{"type": "string", "format": "date-time", "pattern": f"^{_RFC3339}$", "maxLength": 40},
                       {"type": "integer", "minimum": 1, "maximum": JSON_SAFE_MAX}],
             "description": "RFC 3339 timestamp with a zone, or integer Unix milliseconds; required; a past "
                            "deadline is 408"}
_LEASE_ID = {"type": "string", "pattern": "^[A-Za-z0-9-]{1,64}$", "minLength": 1, "maxLength": 64}
_LOCK_KEY = {"type": "string", "pattern": r"^starintel:target-lease:v1:[A-Za-z0-9_-]{43}$"}
_REASON = {"type": "string", "minLength": 1, "maxLength": 256, "pattern": r"\S",
           "description": "printable text (no control characters); trimmed"}


def _identity_props() -> dict[str, Any]:
    props: dict[str, Any] = {name: dict(_IDENTIFIER) for name in IDENTITY_FIELDS}
    props["target_id"] = dict(_TARGET_ID)
    props["operation_class"] = {"type": "string", "enum": list(OPERATION_CLASSES), "default": "default",
                                "description": "case-insensitive"}
    return props


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` or JSON null: the server reads an optional field's null as its absence (the same digest, C16)."""
    if "oneOf" in schema:
        return {**schema, "oneOf": [*schema["oneOf"], {"type": "null"}]}
    out = {**schema, "type": [schema["type"], "null"]}
    if "enum" in out:
        out["enum"] = [*out["enum"], None]
    return out


def _body(extra: dict[str, Any], required: list[str]) -> dict[str, Any]:
    props = {**_identity_props(), "request_id": _ID, "deadline_at": _DEADLINE, "service_instance_id": _ID,
             "trace_id": _ID, "execution_id": _ID, "job_id": _ID, **extra}
    req = [f for f in IDENTITY_FIELDS if f != "operation_class"] + ["request_id", "deadline_at",
                                                                     "service_instance_id"] + required
    # null is accepted for every optional field, as absent: the contract does not say, clients that write an unset
    # optional as null keep working, and lab.client leaves such fields out either way
    props = {name: schema if name in req else _nullable(schema) for name, schema in props.items()}
    return {"type": "object", "additionalProperties": False, "properties": props, "required": req}


_CORRELATION_ID = {
    "name": "X-Correlation-ID", "in": "header", "required": False,
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$", "not": {"pattern": KEY_SHAPE_RE.pattern}},
    "description": "echoed in the answer (body and header) and audited when it is 1-128 characters of "
                   "A-Z a-z 0-9 . _ : -, else replaced by a fresh id. One that could be a credential (anything "
                   "shaped like an API key flk.<credential_id>.<secret>, valid or not, the request's own key, or "
                   "the secret of a credential this server has verified) is refused: 400 invalid_lease_request "
                   "with a fresh id, checked before the credential; it is never echoed, logged or audited."}


def _lease_schema() -> dict[str, Any]:
    props: dict[str, Any] = {"record_version": {"type": "integer", "const": 1}, "lock_key": {"type": "string"},
                             **{name: {"type": "string"} for name in IDENTITY_FIELDS}}
    for name in ("lease_id", "owner_principal_id", "owner_credential_id", "service_instance_id", "request_id",
                 "end_reason", "ended_by", "admin_reason", "incident_id"):
        props[name] = {"type": "string"}
    for name in ("owner_client_id", "execution_id", "job_id", "trace_id"):
        props[name] = {"type": ["string", "null"]}
    props["fencing_token"] = _TOKEN
    for name in ("ttl_ms", "maximum_lifetime_ms"):
        props[name] = {"type": "integer"}
    for name in ("acquired_at", "renewed_at", "expires_at", "ended_at"):
        props[name] = {"type": "string", "format": "date-time", "description": "RFC 3339 UTC, milliseconds"}
        props[name + "_ms"] = {"type": "integer", "description": "the same backend time in Unix ms"}
    props["metadata"] = {"type": "object"}
    props["state"] = {"type": "string", "enum": ["active", "expired", "released", "revoked"]}
    return {"type": "object", "properties": props, "required": ["lease_id", "lock_key", "state"]}


_RESULT_SCHEMA = {"lease_listed": "ListResult", COMMIT_ACCEPTED: "CommitResult"}


def _responses(success: str, codes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"200": {"description": success, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/" + _RESULT_SCHEMA.get(success, "LeaseResult")}}}}}
    by_status: dict[int, list[str]] = {}
    for code in codes:
        by_status.setdefault(HTTP_STATUS[code], []).append(code)
    for status, names in sorted(by_status.items()):
        out[str(status)] = {"description": " | ".join(names), "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/Error"}}}}
    return out


_AUTH_ERRORS = ["invalid_lease_request", "invalid_credential", "access_denied", "lease_backend_unavailable"]
_MUTATION_ERRORS = _AUTH_ERRORS + ["deadline_exceeded", "lease_lost", "idempotency_conflict",
                                   "lease_outcome_unknown"]


def _post(summary: str, body: dict[str, Any], success: str, codes: list[str], path_id: bool) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "security": [{"bearer": []}],
                          "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
                          "responses": _responses(success, codes), "parameters": [_CORRELATION_ID]}
    if path_id:
        op["parameters"].insert(0, {"name": "lease_id", "in": "path", "required": True,
                                    "schema": {"type": "string", "pattern": "^[A-Za-z0-9-]{1,64}$"}})
    return {"post": op}


def openapi_document(settings: Settings | None = None) -> dict[str, Any]:
    """The OpenAPI document of a reference lease server with `settings` (the defaults: docs/openapi.json)."""
    st = settings or Settings()
    p = "/api/v1/target-leases"

    def q(name: str, desc: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"name": name, "in": "query", "required": False, "schema": schema or {"type": "string"},
                "description": desc}

    query_deadline = {"type": "string", "maxLength": 40, "pattern": f"^([1-9][0-9]{{0,14}}|{_RFC3339})$"}
    metadata = {"type": "object", "maxProperties": st.max_metadata_bytes // 8,
                "propertyNames": {"minLength": 1, "maxLength": 64, "pattern": "^[^\\u0000-\\u001f]+$"},
                "description": f"at most {st.max_metadata_bytes} bytes of JSON, {st.max_metadata_depth} levels "
                               "deep; no key or value that looks like a credential"}
    body_note = (f"A request body is at most {st.max_body_bytes} bytes and {st.max_body_depth} levels of JSON "
                 "nesting, and holds no API key or secret (after JSON escapes are decoded). A request's line and "
                 f"headers are at most {st.max_header_bytes} bytes and {st.max_header_fields} header fields, else "
                 "431 Request Header Fields Too Large (plain text, before the API reads the request). Optional "
                 "body fields may be null, read as absent.")
    read_codes = ["invalid_lease_request", "invalid_credential", "access_denied", "lease_not_found",
                  "deadline_exceeded", "lease_backend_unavailable"]
    return {
        "openapi": "3.1.0",
        "info": {"title": "fencelab reference lease server", "version": "1",
                 "description": "Target leases, fencing tokens and the fenced-write boundary (docs/server.md, "
                                "the lease contract rules C1-C29). `commit_accepted` extends section 9's "
                                "200 codes, which list none for commits. " + body_note},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "API key flk.<credential_id>.<secret>"}},
            "schemas": {
                "Lease": _lease_schema(),
                "LeaseResult": {"type": "object", "required": ["status", "code", "correlation_id"], "properties": {
                    "status": {"const": "success"}, "code": {"type": "string", "enum": list(LEASE_SUCCESS_CODES)},
                    "correlation_id": {"type": "string"}, "lease": {"$ref": "#/components/schemas/Lease"},
                    "replayed": {"type": "boolean", "description": "an idempotent retry: the original result, "
                                                                   "with the lease's current state"},
                    "backend_time_ms": {"type": "integer"}}},
                "ListResult": {"type": "object", "required": ["status", "code", "correlation_id", "leases"],
                               "properties": {
                                   "status": {"const": "success"}, "code": {"const": "lease_listed"},
                                   "correlation_id": {"type": "string"},
                                   "leases": {"type": "array", "items": {"$ref": "#/components/schemas/Lease"}},
                                   "next_cursor": {"type": ["string", "null"]},
                                   "backend_time_ms": {"type": "integer"}}},
                "CommitResult": {"type": "object", "required": ["status", "code", "correlation_id", "commit"],
                                 "properties": {
                                     "status": {"const": "success"}, "code": {"const": COMMIT_ACCEPTED},
                                     "correlation_id": {"type": "string"},
                                     "commit": {"$ref": "#/components/schemas/Commit"},
                                     "replayed": {"type": "boolean"}, "backend_time_ms": {"type": "integer"}}},
                "Commit": {"type": "object",
                           "required": ["doc", "db", "rev", "accepted_token", "lease_id", "validated_at_ms"],
                           "properties": {
                               "doc": {"type": "string"}, "db": {"type": "string", "description": "the store "
                                                                "database written (store_db)"},
                               "rev": {"type": "string", "description": "the document revision this commit "
                                       "wrote (on a replay found only in the document: its current revision)"},
                               "accepted_token": _TOKEN, "lease_id": {"type": "string"},
                               "validated_at_ms": {"type": "integer", "description": "backend time of the "
                                                   "lease validation (the linearization point)"},
                               "replayed": {"type": "boolean"}}},
                "Error": {"type": "object", "required": ["status", "code", "msg", "correlation_id", "retryable"],
                          "properties": {
                              "status": {"const": "error"},
                              "code": {"type": "string", "enum": [c for c in HTTP_STATUS if c not in SUCCESS_CODES]},
                              "msg": {"type": "string"}, "correlation_id": {"type": "string"},
                              "retryable": {"type": "boolean"}, "retry_after_ms": {"type": "integer"},
                              "submitted": {"const": False, "description": "present when the server knows "
                                            "nothing was executed (a definite failure)"}}},
            },
        },
        "paths": {
            p + "/acquire": _post(
                "acquire-if-free (C11)",
                _body({"ttl_ms": {"type": "integer", "minimum": st.min_ttl_ms, "maximum": st.max_ttl_ms},
                       "maximum_lifetime_ms": {"type": "integer", "minimum": 1, "maximum": st.max_lifetime_ms,
                                               "description": "at least ttl_ms"},
                       "metadata": metadata, "client_id": _ID,
                       "wait_ms": {"type": "integer", "minimum": 0, "maximum": st.max_acquire_wait_ms,
                                   "description": "bounded retry on conflict"}},
                      ["ttl_ms"]),
                "lease_acquired", _AUTH_ERRORS + ["deadline_exceeded", "lease_conflict", "idempotency_conflict",
                                                  "lease_rate_limited", "lease_outcome_unknown"], False),
            p + "/{lease_id}/renew": _post(
                "renew-if-owner (C12)", _body({"fencing_token": _TOKEN, "ttl_ms": {
                    "type": "integer", "minimum": st.min_ttl_ms, "maximum": st.max_ttl_ms}},
                                              ["fencing_token"]),
                "lease_renewed", _MUTATION_ERRORS + ["lease_rate_limited"], True),
            p + "/{lease_id}/release": _post(
                "release-if-owner (C13)", _body({"fencing_token": _TOKEN}, ["fencing_token"]),
                "lease_released", _MUTATION_ERRORS, True),
            p + "/{lease_id}/force-release": _post(
                "admin force-release of the observed lease (C15)",
                _body({"fencing_token": _TOKEN, "reason": _REASON},
                      ["fencing_token", "reason"]),
                "lease_released", _MUTATION_ERRORS, True),
            p + "/{lease_id}/revoke": _post(
                "admin revoke of the observed lease (C15)",
                _body({"fencing_token": _TOKEN, "reason": _REASON,
                       "incident_id": _ID}, ["fencing_token", "reason"]),
                "lease_revoked", _MUTATION_ERRORS, True),
            p + "/{lease_id}": {"get": {
                "summary": "inspect a lease by id (404 also when outside the caller's scope)",
                "security": [{"bearer": []}],
                "parameters": [{"name": "lease_id", "in": "path", "required": True, "schema": _LEASE_ID},
                               q("deadline_at", "optional deadline", query_deadline), _CORRELATION_ID],
                "responses": _responses("lease_inspected", read_codes)}},
            p: {"get": {
                "summary": "inspect by identity (when any identity field is given) or list (C14)",
                "security": [{"bearer": []}],
                "parameters": [q(name, "identity field (inspect)", schema)
                               for name, schema in _identity_props().items()] + [
                    q("owner", "list filter: owner principal id",
                      {"type": "string", "pattern": "^[a-z0-9][a-z0-9._:-]{0,63}$"}),
                    q("program", "list filter: program_id", _IDENTIFIER),
                    q("target", "list filter: target_id", _TARGET_ID),
                    q("limit", "list page size", {"type": "integer", "minimum": 1, "maximum": st.max_page_size}),
                    q("cursor", "opaque list cursor from next_cursor",
                      {"type": "string", "pattern": "^c1\\.[A-Za-z0-9_-]{43}$"}),
                    q("deadline_at", "optional deadline", query_deadline), _CORRELATION_ID],
                "responses": {**_responses("lease_inspected", read_codes),
                              "200": {"description": "lease_inspected (inspect) or lease_listed (list)",
                                      "content": {"application/json": {"schema": {"anyOf": [
                                          {"$ref": "#/components/schemas/LeaseResult"},
                                          {"$ref": "#/components/schemas/ListResult"}]}}}}}}},
            "/api/v1/commits": _post(
                "the fenced-write boundary (C24-C29): validate the lease, then write the document conditionally",
                _body({"fencing_token": _TOKEN, "lease_id": _LEASE_ID,
                       "lock_key": {**_LOCK_KEY, "description": "optional; must be the key the identity "
                                                                "derives (C24)"},
                       "expires_at": {**_DEADLINE, "description": "optional, informational: backend time decides"},
                       "doc": {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,199}$", "maxLength": 200},
                       "body": {"oneOf": [
                           {"type": "object", "required": ["append"], "additionalProperties": False,
                            "properties": {"append": {"not": {"type": "null"},
                                                      "description": "appended to the document's entries"}}},
                           {"type": "object", "required": ["set"], "additionalProperties": False,
                            "properties": {"set": {
                                "type": "object", "minProperties": 1,
                                "propertyNames": {"pattern": r"^(?!_|fence_|entries$)[A-Za-z0-9][A-Za-z0-9._:@+-]{0,63}$"},
                                "description": "merged into the document (not entries, _* or fence_* fields)"}}}]}},
                      ["fencing_token", "lease_id", "doc", "body"]),
                COMMIT_ACCEPTED, _MUTATION_ERRORS, False),
            "/healthz": {"get": {"summary": "200 when Valkey answers, the scripts are loaded and the recovery "
                                            "rule is not holding mutations",
                                 "parameters": [_CORRELATION_ID],
                                 "responses": {"200": {"description": "healthy"},
                                               "400": {"description": "invalid_lease_request (X-Correlation-ID)"},
                                               "503": {"description": "lease_backend_unavailable"}}}},
            "/openapi.json": {"get": {"summary": "this document", "responses": {"200": {"description": "OpenAPI"}}}},
        },
    }


def write_openapi(path: str | Path) -> Path:
    """Write the document as pretty JSON (docs/openapi.json)."""
    p = Path(path)
    p.write_text(json.dumps(openapi_document(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return p


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m lab.server.openapi OUTPUT.json", file=sys.stderr)
        sys.exit(2)
    print(write_openapi(sys.argv[1]))
