"""The jinja2 environment of the kernel skeletons and construct templates (codegen/mappings/templates/)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jinja2

TEMPLATE_DIR = Path(__file__).parent / "templates"

_env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
                          undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                          trim_blocks=False, lstrip_blocks=False)


def render_template(template: str, ctx: dict[str, Any]) -> str:
    """Render a skeleton; runs of blank lines left by the macros collapse to one."""
    src = _env.get_template(template).render(**ctx)
    return re.sub(r"\n[ \t]*\n(?:[ \t]*\n)+", "\n\n", src)
