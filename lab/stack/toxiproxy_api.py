"""A small async client for Toxiproxy's HTTP API (v2.12), over httpx.

Written here because the `toxiproxy-python` package is synchronous, has no
timeouts and cannot update a toxic in place; the lab needs all three. The
endpoints and payloads follow Toxiproxy's README ("HTTP API") and `api.go`:

- proxies: `GET/POST /proxies`, `GET/PATCH/DELETE /proxies/{proxy}`,
  `POST /populate` (create or replace a list), `POST /reset` (enable every
  proxy and remove every toxic), `GET /version`;
- toxics: `GET/POST /proxies/{proxy}/toxics`,
  `GET/PATCH/DELETE /proxies/{proxy}/toxics/{toxic}`. A toxic has a `type`, a
  `stream` (`upstream` = client to server, `downstream` = server to client), a
  `toxicity` (probability, 0..1) and type-specific `attributes`.

The server answers errors as `{"error": msg, "status": code}`; every one
becomes a `ToxiproxyError` naming the proxy and toxic involved and the server's
message. Arguments are validated before anything is sent.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx

__all__ = [
    "ToxiproxyClient",
    "ToxiproxyError",
    "TOXIC_TYPES",
    "STREAMS",
    "validate_toxic",
]

STREAMS = ("upstream", "downstream")

# Each toxic type and its attributes with their minimum values (README "Toxics", toxics/*.go).
TOXIC_TYPES: dict[str, dict[str, int]] = {
    "latency": {"latency": 0, "jitter": 0},  # ms
    "bandwidth": {"rate": 0},  # KB/s
    "slow_close": {"delay": 0},  # ms
    "timeout": {"timeout": 0},  # ms; 0 = drop data until removed (a blackhole)
    "reset_peer": {"timeout": 0},  # ms
    "slicer": {"average_size": 1, "size_variation": 0, "delay": 0},  # bytes, bytes, µs
    "limit_data": {"bytes": 0},
    "noop": {},
}

_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")


class ToxiproxyError(RuntimeError):
    """Toxiproxy refused a request or could not be reached; names the proxy/toxic and the server's message."""

    def __init__(self, message: str, *, status: int | None = None, proxy: str | None = None,
                 toxic: str | None = None, server_message: str | None = None):
        super().__init__(message)
        self.status = status
        self.proxy = proxy
        self.toxic = toxic
        self.server_message = server_message


def _check_name(what: str, name: Any) -> str:
    """A proxy or toxic name that is safe in a URL path, or ValueError."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"{what} name must be a non-empty string of letters, digits and _.:-, got {name!r}")
    return name


def _check_address(what: str, addr: Any) -> str:
    """A `host:port` string, or ValueError naming `what`."""
    if not isinstance(addr, str) or ":" not in addr:
        raise ValueError(f"{what} must be 'host:port', got {addr!r}")
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{what} must be 'host:port' with a port 0..65535, got {addr!r}")
    return addr


def validate_toxic(type: str, stream: str = "downstream", toxicity: float = 1.0,
                   attributes: dict[str, Any] | None = None, *, partial: bool = False) -> dict[str, Any]:
    """Check a toxic's type, stream, toxicity and attributes; return the attributes (ValueError names the problem).

    With `partial` (an update), attributes may be a subset of the type's.
    """
    if type not in TOXIC_TYPES:
        raise ValueError(f"toxic type must be one of {', '.join(TOXIC_TYPES)}, got {type!r}")
    if stream not in STREAMS:
        raise ValueError(f"toxic stream must be 'upstream' or 'downstream', got {stream!r}")
    if isinstance(toxicity, bool) or not isinstance(toxicity, (int, float)) or not 0.0 <= toxicity <= 1.0:
        raise ValueError(f"toxicity must be a number in [0, 1], got {toxicity!r}")
    known = TOXIC_TYPES[type]
    attrs = dict(attributes or {})
    for k, v in attrs.items():
        if k not in known:
            raise ValueError(f"{type} toxic has no attribute {k!r} (attributes: {', '.join(known) or 'none'})")
        if isinstance(v, bool) or not isinstance(v, int) or v < known[k]:
            raise ValueError(f"{type} toxic attribute {k!r} must be an int >= {known[k]}, got {v!r}")
    if type == "slicer" and not partial:
        avg, var = attrs.get("average_size", 0), attrs.get("size_variation", 0)
        if avg < 1:
            raise ValueError("slicer toxic attribute 'average_size' must be given and >= 1")
        if var >= avg:
            raise ValueError(f"slicer toxic attribute 'size_variation' ({var}) must be smaller than 'average_size' ({avg})")
    return attrs


class ToxiproxyClient:
    """Async client for one Toxiproxy server (`url` like `http://127.0.0.1:8474`)."""

    def __init__(self, url: str, *, timeout: float = 5.0, transport: httpx.AsyncBaseTransport | None = None):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"Toxiproxy url must start with http:// or https://, got {url!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.url = url.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout, transport=transport,
                                       headers={"User-Agent": "fencelab-nemesis"})

    async def __aenter__(self) -> "ToxiproxyClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        await self._http.aclose()

    # -- transport -------------------------------------------------------
    async def _request(self, method: str, path: str, *, body: Any = None, proxy: str | None = None,
                       toxic: str | None = None, ok: tuple[int, ...] = (200, 201, 204)) -> Any:
        """One API call; the decoded JSON answer (None when empty), or ToxiproxyError."""
        what = _subject(proxy, toxic)
        try:
            r = await self._http.request(method, path, json=body)
        except httpx.HTTPError as e:
            raise ToxiproxyError(f"Toxiproxy at {self.url} did not answer {method} {path} ({what}): "
                                 f"{type(e).__name__}: {e}", proxy=proxy, toxic=toxic) from e
        data = _decode(r)
        if r.status_code not in ok:
            msg = data.get("error") if isinstance(data, dict) else None
            msg = msg or r.text.strip() or r.reason_phrase
            raise ToxiproxyError(f"Toxiproxy {method} {path} ({what}) failed with HTTP {r.status_code}: {msg}",
                                 status=r.status_code, proxy=proxy, toxic=toxic, server_message=msg)
        return data

    # -- server ------------------------------------------------------------
    async def version(self) -> str:
        """The server's version string (e.g. `2.12.0`)."""
        data = await self._request("GET", "/version")
        return data["version"] if isinstance(data, dict) else str(data)

    async def reset(self) -> None:
        """Re-enable every proxy and remove every toxic (all proxies, not only the lab's)."""
        await self._request("POST", "/reset")

    # -- proxies -----------------------------------------------------------
    async def proxies(self) -> dict[str, dict]:
        """Every proxy by name, each with its `toxics` list."""
        return await self._request("GET", "/proxies")

    async def get_proxy(self, name: str) -> dict:
        """One proxy (`name`, `listen`, `upstream`, `enabled`, `toxics`)."""
        return await self._request("GET", f"/proxies/{_check_name('proxy', name)}", proxy=name)

    async def create_proxy(self, name: str, upstream: str, listen: str = "127.0.0.1:0", *,
                           enabled: bool = True) -> dict:
        """Create a proxy (listen port 0: the server picks one and reports it in `listen`)."""
        body = {"name": _check_name("proxy", name), "upstream": _check_address("upstream", upstream),
                "listen": _check_address("listen", listen), "enabled": bool(enabled)}
        return await self._request("POST", "/proxies", body=body, proxy=name)

    async def update_proxy(self, name: str, *, listen: str | None = None, upstream: str | None = None,
                           enabled: bool | None = None) -> dict:
        """Change a proxy's fields (a new listen/upstream restarts it and drops its connections)."""
        body: dict[str, Any] = {}
        if listen is not None:
            body["listen"] = _check_address("listen", listen)
        if upstream is not None:
            body["upstream"] = _check_address("upstream", upstream)
        if enabled is not None:
            body["enabled"] = bool(enabled)
        if not body:
            raise ValueError("update_proxy needs at least one of listen, upstream, enabled")
        return await self._request("PATCH", f"/proxies/{_check_name('proxy', name)}", body=body, proxy=name)

    async def enable(self, name: str) -> dict:
        """Start the proxy listening again."""
        return await self.update_proxy(name, enabled=True)

    async def disable(self, name: str) -> dict:
        """Take the proxy down: stop listening and drop its connections."""
        return await self.update_proxy(name, enabled=False)

    async def delete_proxy(self, name: str) -> None:
        """Delete the proxy (and its toxics)."""
        await self._request("DELETE", f"/proxies/{_check_name('proxy', name)}", proxy=name)

    async def populate(self, proxies: list[dict]) -> list[dict]:
        """Create or replace a list of proxies (`name`, `upstream`, `listen`, `enabled`?) in one call."""
        if not isinstance(proxies, list):
            raise ValueError(f"populate takes a list of proxies, got {type(proxies).__name__}")
        body = []
        for i, p in enumerate(proxies):
            if not isinstance(p, dict):
                raise ValueError(f"populate: proxy #{i + 1} must be a dict, got {p!r}")
            extra = set(p) - {"name", "upstream", "listen", "enabled"}
            if extra:
                raise ValueError(f"populate: proxy #{i + 1} has unknown field(s) {', '.join(sorted(extra))}")
            item = {"name": _check_name("proxy", p.get("name")),
                    "upstream": _check_address(f"upstream of proxy {p.get('name')}", p.get("upstream")),
                    "listen": _check_address(f"listen of proxy {p.get('name')}", p.get("listen", "127.0.0.1:0"))}
            if "enabled" in p:
                item["enabled"] = bool(p["enabled"])
            body.append(item)
        names = ", ".join(p["name"] for p in body)
        data = await self._request("POST", "/populate", body=body, proxy=names)
        return list(data.get("proxies") or [])

    # -- toxics ------------------------------------------------------------
    async def toxics(self, proxy: str) -> list[dict]:
        """The toxics active on `proxy`."""
        return await self._request("GET", f"/proxies/{_check_name('proxy', proxy)}/toxics", proxy=proxy)

    async def get_toxic(self, proxy: str, name: str) -> dict:
        """One toxic of `proxy`."""
        path = f"/proxies/{_check_name('proxy', proxy)}/toxics/{_check_name('toxic', name)}"
        return await self._request("GET", path, proxy=proxy, toxic=name)

    async def add_toxic(self, proxy: str, type: str, *, name: str | None = None, stream: str = "downstream",
                        toxicity: float = 1.0, attributes: dict[str, Any] | None = None) -> dict:
        """Add a toxic (default name `<type>_<stream>`, as the server would choose); returns it."""
        attrs = validate_toxic(type, stream, toxicity, attributes)
        name = _check_name("toxic", name or f"{type}_{stream}")
        body = {"name": name, "type": type, "stream": stream, "toxicity": float(toxicity), "attributes": attrs}
        return await self._request("POST", f"/proxies/{_check_name('proxy', proxy)}/toxics", body=body,
                                   proxy=proxy, toxic=name)

    async def update_toxic(self, proxy: str, name: str, *, attributes: dict[str, Any] | None = None,
                           toxicity: float | None = None) -> dict:
        """Change a live toxic's attributes (those given) and/or toxicity, without removing it."""
        current = await self.get_toxic(proxy, name)
        attrs = validate_toxic(current["type"], current["stream"], 1.0 if toxicity is None else toxicity,
                               attributes, partial=True)
        body: dict[str, Any] = {"attributes": attrs}
        if toxicity is not None:
            body["toxicity"] = float(toxicity)
        path = f"/proxies/{proxy}/toxics/{name}"
        return await self._request("PATCH", path, body=body, proxy=proxy, toxic=name)

    async def remove_toxic(self, proxy: str, name: str) -> None:
        """Remove a toxic from `proxy`."""
        path = f"/proxies/{_check_name('proxy', proxy)}/toxics/{_check_name('toxic', name)}"
        await self._request("DELETE", path, proxy=proxy, toxic=name)


def _subject(proxy: str | None, toxic: str | None) -> str:
    """`proxy X, toxic Y` for messages."""
    parts = []
    if proxy:
        parts.append(f"proxy {proxy}")
    if toxic:
        parts.append(f"toxic {toxic}")
    return ", ".join(parts) or "server"


def _decode(r: httpx.Response) -> Any:
    """The response's JSON (errors come as text/plain JSON from Go's http.Error), or None."""
    if not r.content:
        return None
    try:
        return json.loads(r.content)
    except ValueError:
        return None
