"""The one jinja2 setup for every self-contained HTML page the lab writes (reports, campaigns, evidence).

Autoescaping is always on and undefined variables are errors, so a page never
shows raw input or silently drops a field.
"""

from __future__ import annotations

from pathlib import Path

import jinja2


def template_env(folder: Path, *, trim: bool = True) -> jinja2.Environment:
    """A jinja2 Environment loading templates from `folder`, autoescaped, strict about undefined names."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(folder),
        autoescape=jinja2.select_autoescape(["html", "j2"], default=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=trim,
        lstrip_blocks=trim,
    )
