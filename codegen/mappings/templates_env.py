"""The jinja2 environment of the kernel skeletons and construct templates (codegen/mappings/templates/)."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import jinja2
import jinja2.bccache

from codegen.cuda.cache import cache_dir

TEMPLATE_DIR = Path(__file__).parent / "templates"
_OPTIONS = dict(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=False, lstrip_blocks=False)


class _CompiledTemplates(jinja2.FileSystemBytecodeCache):
    """Compiled templates on disk ($DERIVC_CACHE_DIR/jinja): jinja's compile of the skeletons
    costs more than a render, and every build process (a mutation test's subprocess) would
    repeat it.  The key covers the template's full source, its name and path, the environment's
    options and the jinja2 version (jinja's own key is the name alone: a changed option would
    load stale code); a bucket also checks its magic (jinja's format and the Python version) and
    the source's checksum.  Entries are written to a temporary name and renamed into place."""

    def get_bucket(self, environment: jinja2.Environment, name: str, filename: str | None,
                   source: str) -> jinja2.bccache.Bucket:
        h = hashlib.sha256(f"{jinja2.__version__}\0{_OPTIONS!r}\0{name}\0{filename}\0".encode())
        h.update(source.encode())
        bucket = jinja2.bccache.Bucket(environment, h.hexdigest(), self.get_source_checksum(source))
        self.directory = str(cache_dir() / "jinja")  # $DERIVC_CACHE_DIR as it is now
        self.load_bytecode(bucket)
        return bucket

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            Path(self.directory).mkdir(parents=True, exist_ok=True)
            super().dump_bytecode(bucket)
        except OSError:  # an unwritable cache: the template was compiled all the same
            pass


_env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
                          bytecode_cache=_CompiledTemplates(str(cache_dir() / "jinja")), **_OPTIONS)


def render_template(template: str, ctx: dict[str, Any]) -> str:
    """Render a skeleton; runs of blank lines left by the macros collapse to one."""
    src = _env.get_template(template).render(**ctx)
    return re.sub(r"\n[ \t]*\n(?:[ \t]*\n)+", "\n\n", src)
