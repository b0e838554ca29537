"""What the self-contained HTML pages (the report, the comparison) share: one jinja2 environment over
`templates/`, their inline assets, and a Content-Security-Policy that allows exactly those assets."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import jinja2

HERE = Path(__file__).parent


def environment() -> jinja2.Environment:
    """Autoescaping, strict about undefined names (jinja2 is imported here, only when a page is rendered)."""
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(HERE / "templates")),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def asset(name: str) -> str:
    """The text of `assets/<name>`, to inline in a page."""
    return (HERE / "assets" / name).read_text(encoding="utf-8")


def csp(css: str, js: str | None = None) -> str:
    """Nothing but the page's own inline style (and script, if any), allowed by their hashes."""
    script = f"script-src '{_sha256(js)}'; " if js is not None else ""
    return f"default-src 'none'; {script}style-src '{_sha256(css)}'; img-src data:; base-uri 'none'; form-action 'none'"


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")
