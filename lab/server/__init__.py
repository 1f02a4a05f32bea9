"""The reference lease server: the lease contract (C1-C23) over a real Valkey.

See docs/server.md. Entry points: `lab.server.app.create_app(settings)` (the
ASGI app), `python -m lab.server` (uvicorn), `lab.server.testing` (in-process
runs), `lab.server.auth.provision_demo_principals()` (demo credentials).
Kept import-light so the command line validates its arguments quickly.
"""
