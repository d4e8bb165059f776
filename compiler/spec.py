"""The schedule file: spec (sizes, inputs, statements, output) and schedule, validated.

    name: gemm
    sizes: {M: dynamic, N: dynamic, K: dynamic}
    inputs:
      A: {shape: [M, K], dtype: f16}
      B: {shape: [K, N], dtype: f16}
    statements:
      - C[i, j] = sum(k: A[i, k] * B[k, j])
    output: {tensor: C, dtype: f16}
    schedule:
      - {rule: tile, def: C, index: i, size: 128}
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import SpecError

Dtype = Literal["f16", "bf16", "f32"]


class TensorDecl(BaseModel):
    model_config = ConfigDict(extra="forbid")
    shape: list[str] = Field(min_length=1)
    dtype: Dtype


class OutputDecl(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tensor: str
    dtype: Dtype = "f32"


class ScheduleStep(BaseModel):
    model_config = ConfigDict(extra="allow")
    rule: str

    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class SpecFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    description: str = ""
    sizes: dict[str, Union[int, Literal["dynamic"]]]
    inputs: dict[str, TensorDecl]
    params: dict[str, Union[float, str]] = {}
    statements: list[str] = Field(min_length=1)
    output: OutputDecl
    schedule: list[ScheduleStep] = []
    check_sizes: dict[str, int] = {}

    @field_validator("statements", mode="before")
    @classmethod
    def _quoted(cls, v: Any) -> Any:
        if isinstance(v, list):
            for k, x in enumerate(v):
                if isinstance(x, dict):
                    raise ValueError(
                        f"statement {k} was read as a YAML mapping: quote it, e.g. - \"C[i, j] = sum(k: ...)\""
                    )
        return v

    @field_validator("sizes")
    @classmethod
    def _positive(cls, v: dict[str, Any]) -> dict[str, Any]:
        for k, x in v.items():
            if isinstance(x, int) and x <= 0:
                raise ValueError(f"size {k} must be positive, got {x}")
            if not re.fullmatch(r"[A-Za-z_]\w*", k):
                raise ValueError(f"bad size name {k!r}")
        return v


def _where(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for x in loc:
        if isinstance(x, int):
            parts.append(f"[{x}]")
        else:
            parts.append(("." if parts else "") + str(x))
    return "".join(parts) or "file"


def load_spec_file(path: str | Path) -> SpecFile:
    """Read and validate a schedule file; every failure is one SpecError naming the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError("file", f"cannot read: {exc.strerror}", str(path)) from None
    return parse_spec_text(text, str(path))


def parse_spec_text(text: str, file: str = "<string>") -> SpecFile:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "yaml"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(where, f"malformed YAML: {problem}", file) from None
    if not isinstance(raw, dict):
        raise SpecError("file", "expected a mapping with name, sizes, inputs, statements, output", file)
    try:
        return SpecFile.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(x for x in err["loc"] if x not in ("int", "literal['dynamic']"))
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        raise SpecError(_where(loc), msg, file) from None


def param_value(spec: SpecFile, name: str) -> float:
    """A parameter: a number, or `1/sqrt(SIZE)` / `rsqrt(SIZE)` of a fixed size."""
    raw = spec.params[name]
    if isinstance(raw, (int, float)):
        return float(raw)
    m = re.fullmatch(r"\s*(?:1\s*/\s*sqrt|rsqrt)\(\s*([A-Za-z_]\w*)\s*\)\s*", raw)
    if not m:
        raise SpecError(f"params.{name}", f"expected a number or 1/sqrt(SIZE), got {raw!r}")
    size = spec.sizes.get(m.group(1))
    if not isinstance(size, int):
        raise SpecError(f"params.{name}", f"{m.group(1)} must be a fixed size to use it in a parameter")
    return 1.0 / math.sqrt(size)
