"""The Compose files, checked without a Docker engine (this machine has none).

`docker-compose config` (Debian's docker-compose, `scripts/install.sh
compose-tools`) validates and interpolates compose/docker-compose.yml; the
YAML, compose/toxiproxy.json and the Dockerfiles are then read directly to
check the stack's rules: health checks everywhere, loopback-only ports, the
lease servers reaching Valkey and the store only through Toxiproxy, no
literal secret, proxy names `<from>_<to>`, libfaketime only on request.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from lab.paths import REPO_ROOT
from lab.stack.compose import compose_limits, load_proxies
from lab.stack.topology import link_name

COMPOSE_DIR = REPO_ROOT / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
TOXIPROXY_JSON = COMPOSE_DIR / "toxiproxy.json"
SERVER_DOCKERFILE = COMPOSE_DIR / "Dockerfile.server"
VALKEY_DOCKERFILE = COMPOSE_DIR / "Dockerfile.valkey"
WRAPPER = COMPOSE_DIR / "fencelab-faketime.sh"
ENV_REF = re.compile(r"\$\{[A-Z][A-Z0-9_]*(?::?[-?][^}]*)?\}")
SECRET_WORDS = re.compile(r"PASSWORD|SECRET|TOKEN|API_?KEY|COOKIE", re.I)
CONTAINER_PORTS = {"valkey": 6379, "store": 5984, "toxiproxy": 8474}


@pytest.fixture(scope="module")
def compose() -> dict:
    """The compose file as YAML (anchors and merge keys resolved, variables not)."""
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


@pytest.fixture(scope="module")
def proxies() -> dict:
    return load_proxies(TOXIPROXY_JSON)


def lease_services(services: dict) -> list[str]:
    return sorted(n for n in services if re.fullmatch(r"lease-\d+", n))


def option(command: list[str], flag: str) -> str:
    """The value after `flag` in an argv list."""
    assert flag in command, f"{flag} missing from {command}"
    return command[command.index(flag) + 1]


def test_file_defines_the_stack(services):
    assert {"valkey", "store", "toxiproxy"} <= set(services)
    assert lease_services(services), "no lease-N service"
    assert services["store"]["image"].startswith("couchdb:3")
    assert services["toxiproxy"]["image"] == "ghcr.io/shopify/toxiproxy:2.12.0"
    assert services["valkey"]["build"]["dockerfile"] == "Dockerfile.valkey"
    for name in lease_services(services):
        assert services[name]["build"] == {"context": "..", "dockerfile": "compose/Dockerfile.server"}


# -- docker-compose config ----------------------------------------------------------------
def compose_env(tmp_path: Path, **overrides: str) -> dict[str, str]:
    """A clean environment for `docker-compose config` (no user .env leaks in)."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path),
           "COUCHDB_USER": "ci-user", "COUCHDB_PASSWORD": "ci-password", "FENCELAB_STATE_DIR": str(tmp_path)}
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


def run_config(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    exe = shutil.which("docker-compose")
    if exe is None:
        if os.geteuid() == 0:  # `make test` as root installs it (scripts/install.sh compose-tools)
            pytest.fail("docker-compose is not installed: run scripts/install.sh compose-tools")
        pytest.skip("docker-compose is not installed and installing it needs root (scripts/install.sh compose-tools)")
    empty = tmp_path / "empty.env"
    empty.write_text("")
    return subprocess.run([exe, "--env-file", str(empty), "-f", str(COMPOSE_FILE), "config"],
                          env=env, capture_output=True, text=True, timeout=60)


def test_docker_compose_config_validates_and_binds_loopback(tmp_path):
    r = run_config(tmp_path, compose_env(tmp_path))
    assert r.returncode == 0, r.stderr
    resolved = yaml.safe_load(r.stdout)
    assert set(resolved["services"]) >= {"valkey", "store", "toxiproxy", "lease-1"}
    for name, svc in resolved["services"].items():
        for port in svc.get("ports", []):
            host_ip = port["host_ip"] if isinstance(port, dict) else str(port).split(":")[0]
            assert host_ip == "127.0.0.1", f"{name} publishes {port} beyond loopback"
    lease1 = resolved["services"]["lease-1"]
    assert option(lease1["command"], "--store-url") == "http://ci-user:ci-password@toxiproxy:26201"


@pytest.mark.parametrize("missing", ["COUCHDB_PASSWORD", "COUCHDB_USER", "FENCELAB_STATE_DIR"])
def test_docker_compose_config_refuses_missing_required_variables(tmp_path, missing):
    r = run_config(tmp_path, compose_env(tmp_path, **{missing: None}))
    assert r.returncode != 0
    assert missing in r.stderr


# -- the rules, on the YAML ----------------------------------------------------------------------
def test_every_service_has_a_healthcheck(services):
    for name, svc in services.items():
        hc = svc.get("healthcheck")
        assert hc and not hc.get("disable"), f"{name} has no healthcheck"
        assert hc["test"][0] in ("CMD", "CMD-SHELL") and len(hc["test"]) > 1, f"{name}: {hc['test']}"
        assert {"interval", "timeout", "retries"} <= set(hc), f"{name}: healthcheck timing missing"


def test_every_published_port_binds_loopback(services):
    published = 0
    for name, svc in services.items():
        for port in svc.get("ports", []):
            assert isinstance(port, str), f"{name}: use the short 127.0.0.1:HOST:CONTAINER form, not {port!r}"
            assert re.fullmatch(r"127\.0\.0\.1:(\d*|X):\d+", ENV_REF.sub("X", port)), f"{name} publishes {port!r}"
            published += 1
    assert published >= len(services)


def test_lease_servers_reach_backends_only_through_toxiproxy(services, proxies):
    backend_nets = set(services["valkey"]["networks"]) | set(services["store"]["networks"])
    assert set(services["toxiproxy"]["networks"]) >= backend_nets
    for name in lease_services(services):
        svc = services[name]
        assert not set(svc["networks"]) & backend_nets, f"{name} shares a network with valkey/store"
        assert set(svc["networks"]) <= set(services["toxiproxy"]["networks"])
        cmd = svc["command"]
        valkey = re.fullmatch(r"redis://toxiproxy:(\d+)/0", option(cmd, "--valkey-url"))
        store = re.fullmatch(r"http://[^@]+@toxiproxy:(\d+)", option(cmd, "--store-url"))
        assert valkey and store, f"{name} dials a backend directly: {cmd}"
        assert proxies[f"{name}_valkey"]["listen"].endswith(f":{valkey.group(1)}")
        assert proxies[f"{name}_store"]["listen"].endswith(f":{store.group(1)}")
        text = " ".join(map(str, cmd)) + " " + " ".join(map(str, (svc.get("environment") or {}).values()))
        assert not re.search(r"\b(valkey|store):\d", text), f"{name} names a backend host: {text}"


def test_no_literal_secrets(services):
    for name, svc in services.items():
        for key, value in (svc.get("environment") or {}).items():
            if SECRET_WORDS.search(key) or key.endswith("_USER"):
                assert ENV_REF.fullmatch(str(value)), f"{name}: {key} must be a ${{VAR}} reference, not {value!r}"
        for arg in svc.get("command") or []:
            for userinfo in re.findall(r"//([^/@]+)@", str(arg)):
                both = f"({ENV_REF.pattern}):({ENV_REF.pattern})"
                assert re.fullmatch(both, userinfo), f"{name}: literal credentials in {arg!r}"
    text = COMPOSE_FILE.read_text()
    assert not re.search(r"(?i)(password|secret)\s*[:=]\s*['\"]?(?!\$\{)[A-Za-z0-9]", text)


def test_env_example_documents_every_variable_and_holds_no_secret():
    used = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)", COMPOSE_FILE.read_text()))
    example = {}
    for line in (COMPOSE_DIR / ".env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            example[key.strip()] = value.strip()
    assert used <= set(example), f"not in .env.example: {sorted(used - set(example))}"
    for key, value in example.items():
        if SECRET_WORDS.search(key) or key.endswith("_USER"):
            assert value == "", f".env.example gives {key} a value"


def test_toxiproxy_config_names_links_from_to(services, proxies):
    assert len(proxies) == len({p["listen"] for p in proxies.values()}), "two proxies share a listen port"
    for name, p in proxies.items():
        assert name == link_name(p["frm"], p["to"])
        host, port = p["upstream"].rsplit(":", 1)
        to_service = {"valkey": "valkey", "store": "store"}.get(p["to"], p["to"])
        assert host == to_service and to_service in services, f"{name} -> {p['upstream']}"
        assert int(port) == CONTAINER_PORTS.get(to_service, 8080), f"{name}: wrong upstream port {port}"
    servers, clients = compose_limits(proxies)
    assert servers == len(lease_services(services)) and clients >= 1
    published = {int(p.rsplit(":", 1)[1]) for p in services["toxiproxy"]["ports"]}
    for name, p in proxies.items():
        if p["frm"].startswith("c"):
            assert int(p["listen"].rsplit(":", 1)[1]) in published, f"client link {name} is not published"
    tp = services["toxiproxy"]
    assert "-config=/config/toxiproxy.json" in tp["command"]
    assert "./toxiproxy.json:/config/toxiproxy.json:ro" in tp["volumes"]


def test_lease_commands_are_accepted_by_the_server(services, tmp_path):
    from lab.server.__main__ import parse_args
    from lab.server.auth import provision_demo_principals, write_principals_file

    write_principals_file(provision_demo_principals()[0], tmp_path / "principals" / "principals.json")
    for name in lease_services(services):
        argv = [ENV_REF.sub("x", a).replace("/fencelab/", f"{tmp_path}/") for a in services[name]["command"]]
        assert argv[:3] == ["python", "-m", "lab.server"]
        args, settings = parse_args(argv[3:])
        assert args.instance_id == name and args.port == 8080 and args.host == "0.0.0.0"
        assert settings.store_url.startswith("http://x:x@toxiproxy:")


def test_fake_clocks_only_on_request(services):
    for name in ["valkey", *lease_services(services)]:
        svc = services[name]
        env = svc["environment"]
        assert env["FENCELAB_FAKETIME"] == "${FENCELAB_FAKETIME:-0}", f"{name}: faketime must default to off"
        assert env["FENCELAB_CLOCK_FILE"] == f"/fencelab/clocks/{name}.rc"
        mounts = [v for v in svc["volumes"] if v.endswith(":/fencelab/clocks:ro")]
        assert mounts and mounts[0].startswith("${FENCELAB_STATE_DIR"), f"{name}: clocks/ not mounted as a directory"
    for path in (COMPOSE_FILE, SERVER_DOCKERFILE, VALKEY_DOCKERFILE):
        assert "LD_PRELOAD" not in path.read_text().replace("# LD_PRELOAD is set by the wrapper", ""), path


# -- the Dockerfiles ----------------------------------------------------------------------------------
def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, comments dropped and `\\` continuations joined (hadolint is not here)."""
    out, buf = [], ""
    for line in path.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        buf += line.rstrip()
        if buf.endswith("\\"):
            buf = buf[:-1] + " "
            continue
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def test_server_dockerfile_copies_and_installs_the_project():
    ins = instructions(SERVER_DOCKERFILE)
    assert ins[0] == ("FROM", "python:3.11-slim")
    runs = [a for i, a in ins if i == "RUN"]
    copies = [shlex.split(a) for i, a in ins if i == "COPY"]
    project = [c for c in copies if c[0] == "."]
    assert project, "the project is not copied"
    dest = project[0][-1]
    assert any(re.search(rf"pip install (--no-cache-dir )?{re.escape(dest)}\b", r) for r in runs), runs
    assert any("apt-get install" in r and "libfaketime" in r for r in runs)
    user = [a for i, a in ins if i == "USER"]
    assert user and user[-1] not in ("0", "root"), "the server must not run as root by default"
    assert ins[[i for i, _ in ins].index("ENTRYPOINT")][1] == '["fencelab-faketime"]'
    assert not any(i == "ENV" and "LD_PRELOAD" in a for i, a in ins)
    for c in copies:
        for src in c[:-1]:
            assert (REPO_ROOT / src).exists(), f"COPY source {src} missing"


def test_dockerignore_keeps_the_package_and_drops_state_and_secrets(tmp_path):
    from docker.utils.build import exclude_paths  # the SDK's own .dockerignore semantics

    patterns = [ln.strip() for ln in (REPO_ROOT / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    sent = set(exclude_paths(str(REPO_ROOT), patterns, dockerfile="compose/Dockerfile.server"))
    for needed in ("pyproject.toml", "README.md", "lab/server/__main__.py", "nemesis", "checkers", "workloads",
                   "compose/fencelab-faketime.sh"):
        assert needed in sent, f"{needed} is not in the build context"
    assert not any(p.startswith((".tools", ".git/", "tests/")) for p in sent)
    # a secret dropped anywhere in a checkout never reaches an image
    fake = tmp_path / "ctx"
    (fake / "lab").mkdir(parents=True)
    for secret in ("credentials.json", "lab/credentials.json", "compose/.env", "principals.json"):
        (fake / secret).parent.mkdir(parents=True, exist_ok=True)
        (fake / secret).write_text("{}")
    assert not set(exclude_paths(str(fake), patterns)) & {"credentials.json", "lab/credentials.json",
                                                           "compose/.env", "principals.json"}


def test_valkey_dockerfile_adds_libfaketime_to_the_official_image():
    ins = instructions(VALKEY_DOCKERFILE)
    assert ins[0][0] == "FROM" and re.fullmatch(r"valkey/valkey:8(-bookworm)?", ins[0][1])
    assert any(i == "RUN" and "apt-get install" in a and "libfaketime" in a for i, a in ins)
    assert ('ENTRYPOINT', '["fencelab-faketime", "docker-entrypoint.sh"]') in ins


# -- the libfaketime wrapper, run here with sh ------------------------------------------------------------
def run_wrapper(env: dict[str, str], *cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(WRAPPER), *cmd], env={"PATH": os.environ["PATH"], **env},
                          capture_output=True, text=True, timeout=30)


def test_wrapper_leaves_the_command_alone_by_default():
    r = run_wrapper({}, "env")
    assert r.returncode == 0 and "LD_PRELOAD" not in r.stdout


@pytest.mark.parametrize("env, message", [
    ({"FENCELAB_FAKETIME": "yes"}, "must be 0 or 1"),
    ({"FENCELAB_FAKETIME": "1"}, "needs FENCELAB_CLOCK_FILE"),
    ({"FENCELAB_FAKETIME": "1", "FENCELAB_CLOCK_FILE": "/nonexistent/lease-1.rc"}, "cannot read the clock file"),
])
def test_wrapper_refuses_bad_settings_with_one_line(env, message):
    r = run_wrapper(env, "true")
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_wrapper_puts_the_command_under_libfaketime(tmp_path):
    libs = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    if not libs:
        pytest.skip("libfaketime is not installed (scripts/install.sh faketime)")
    clock = tmp_path / "clocks" / "lease-1.rc"
    clock.parent.mkdir()
    clock.write_text("+86400\n")
    env = {"FENCELAB_FAKETIME": "1", "FENCELAB_CLOCK_FILE": str(clock), "FENCELAB_LIBFAKETIME": str(libs[0])}
    r = run_wrapper(env, "date", "+%s")
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) - time.time() > 86_000  # a day ahead: the offset file is read
    r = run_wrapper(env, "env")
    assert f"LD_PRELOAD={libs[0]}" in r.stdout and "FAKETIME_DONT_FAKE_MONOTONIC=1" in r.stdout
