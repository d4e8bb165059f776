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
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError, field_validator

from .errors import SpecError, did_you_mean

MAX_YAML_DEPTH = 32  # nesting of mappings / lists in a schedule file
MAX_SIZE = 2**31 - 1  # sizes index with 32-bit arithmetic in the kernels

Dtype = Literal["f16", "bf16", "f32", "f64"]


class TensorDecl(BaseModel):
    model_config = ConfigDict(extra="forbid")
    shape: list[str] = Field(min_length=1)
    dtype: Dtype


class AlsoOutputDecl(BaseModel):
    """A further output of the kernel: a tensor one of the statements defines (e.g. the rows'
    log-sum-exp LSE beside O), written by the same kernel once a rule fuses it (fold_stat)."""

    model_config = ConfigDict(extra="forbid")
    tensor: str
    dtype: Dtype = "f32"


class OutputDecl(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tensor: str
    dtype: Dtype = "f32"
    also: list[AlsoOutputDecl] = []

    def tensors(self) -> list[str]:
        """Every output, the main one first."""
        return [self.tensor] + [a.tensor for a in self.also]

    def dtype_of(self, name: str) -> str | None:
        return {self.tensor: self.dtype, **{a.tensor: a.dtype for a in self.also}}.get(name)


class ScheduleStep(BaseModel):
    model_config = ConfigDict(extra="allow")
    rule: str

    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class GradKernelDecl(BaseModel):
    """One kernel of the backward: the gradient program read at `output`, scheduled.  `dtype`
    stores the output in another dtype than the gradient program's (an f32 intermediate such as
    dX in f16, so that the later kernels read it as a tensor-core operand): a storage choice,
    validated numerically like the forward's f16 output, not part of GRAD's meaning.  `also`:
    further tensors the same kernel writes (FUSE-SUMS' dK beside dV: one pass for both); every
    step of the kernel's schedule checks them too, and its schedule must leave one definition."""

    model_config = ConfigDict(extra="forbid")
    output: str
    also: list[str] = []
    dtype: Dtype | None = None
    schedule: list[ScheduleStep] = []


class GradDecl(BaseModel):
    """`grad:` — the gradients of the output `of` with respect to the inputs `wrt`; the seed
    adjoint (`seed`, default d<of>) is an input of the backward.  `schedule` rewrites the whole
    gradient program; `kernels` are built in order, a tensor one of them writes being read by
    the later ones."""

    model_config = ConfigDict(extra="forbid")
    of: str
    wrt: list[str] = Field(min_length=1)
    seed: str | None = None
    schedule: list[ScheduleStep] = []
    kernels: list[GradKernelDecl] = Field(min_length=1)


class SpecFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    description: str = ""
    sizes: dict[str, Union[int, Literal["dynamic"]]]
    inputs: dict[str, TensorDecl]
    params: dict[str, Union[StrictInt, StrictFloat, StrictStr]] = {}
    statements: list[str] = Field(min_length=1)
    output: OutputDecl
    schedule: list[ScheduleStep] = []
    check_sizes: dict[str, int] = {}
    grad: GradDecl | None = None
    # free choices of the schedule, `$name` in its steps (compiler.schedule_variants)
    variants: dict[str, list[Union[StrictInt, StrictStr]]] = {}

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

    @field_validator("variants")
    @classmethod
    def _choices(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for k, values in v.items():
            if not re.fullmatch(r"[A-Za-z_]\w*", k):
                raise ValueError(f"bad variant name {k!r}")
            if not values:
                raise ValueError(f"variant {k} lists no value")
        return v


# --------------------------------------------------------------------------- strict YAML


class StrictLoader(yaml.SafeLoader):
    """YAML without surprises: duplicate keys are errors, numbers are YAML 1.2 numbers (so
    `1e-6` is a float and `0x80`, `yes`, `1:30` stay strings), nesting is bounded."""

    yaml_implicit_resolvers: dict = {}

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                mark = self.peek_event().start_mark
                raise SpecError(f"line {mark.line + 1}", f"YAML nested deeper than {MAX_YAML_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:  # named as written (`true:` is the key True, `null:` None)
                    shown = key_node.value if isinstance(key_node, yaml.ScalarNode) else key
                    raise SpecError(f"line {line}", f"duplicate key {shown!r} (first at line {seen[key]})")
                seen[key] = line
            except TypeError:  # an unhashable key: reported by the base class
                continue
        return super().construct_mapping(node, deep)


for _tag, _regex, _first in (
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
    ("tag:yaml.org,2002:int", r"^[-+]?[0-9]+$", list("-+0123456789")),
    ("tag:yaml.org,2002:float",
     r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
     list("-+.0123456789")),
):
    StrictLoader.add_implicit_resolver(_tag, re.compile(_regex), _first)
for _first, _resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items():  # merge keys, values
    for _tag, _regex in _resolvers:
        if _tag in ("tag:yaml.org,2002:merge", "tag:yaml.org,2002:value"):
            StrictLoader.add_implicit_resolver(_tag, _regex, [_first])


def _check_raw(raw: dict[str, Any]) -> None:
    """What pydantic would coerce: sizes and check sizes must be integers, not bools or strings."""
    def check(field: str, value: Any, allow_dynamic: bool) -> None:
        if not isinstance(value, dict):
            return  # pydantic reports the type
        for k, x in value.items():
            ok = (isinstance(x, int) and not isinstance(x, bool)) or (allow_dynamic and x == "dynamic")
            if not ok:
                want = "a positive integer or dynamic" if allow_dynamic else "a positive integer"
                got = f"the string {x!r}" if isinstance(x, str) else f"{type(x).__name__} {x!r}"
                raise SpecError(f"{field}.{k}", f"expected {want}, got {got}")
            if isinstance(x, int) and x <= 0:
                raise SpecError(f"{field}.{k}", f"must be positive, got {x}")
            if isinstance(x, int) and x > MAX_SIZE:
                raise SpecError(f"{field}.{k}", f"{x} is too large: sizes must be below 2^31 (32-bit index arithmetic)")

    check("sizes", raw.get("sizes"), True)
    check("check_sizes", raw.get("check_sizes"), False)
    sizes, checked = raw.get("sizes"), raw.get("check_sizes")
    if isinstance(sizes, dict) and isinstance(checked, dict):
        for k in checked:
            if k not in sizes:
                raise SpecError(f"check_sizes.{k}",
                                f"unknown size {k!r}{did_you_mean(k, sizes)} (declared: {', '.join(map(str, sizes))})")


_FIELDS_OF = {(): "SpecFile", ("inputs",): "TensorDecl", ("output",): "OutputDecl", ("grad",): "GradDecl"}


def _unknown_field_hint(loc: tuple[Any, ...]) -> str:
    models = {"SpecFile": SpecFile, "TensorDecl": TensorDecl, "OutputDecl": OutputDecl, "GradDecl": GradDecl}
    parent = () if len(loc) == 1 else (loc[0],)
    model = models.get(_FIELDS_OF.get(parent, ""))
    if model is None:
        return ""
    known = list(model.model_fields)
    return f"{did_you_mean(loc[-1], known)} (fields: {', '.join(known)})"


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
        raw = yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except SpecError as exc:
        raise exc.in_file(file) from None
    except RecursionError:
        raise SpecError("yaml", f"nested too deeply (limit {MAX_YAML_DEPTH} levels)", file) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "yaml"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(where, f"malformed YAML: {problem}", file) from None
    if not isinstance(raw, dict):
        raise SpecError("file", "expected a mapping with name, sizes, inputs, statements, output", file)
    try:
        _check_raw(raw)
    except SpecError as exc:
        raise exc.in_file(file) from None
    try:
        return SpecFile.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])  # a typo first
        loc = tuple(x for x in err["loc"] if x not in ("int", "literal['dynamic']"))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field" + _unknown_field_hint(loc)
        raise SpecError(_where(loc), msg, file) from None


def param_value(spec: SpecFile, name: str) -> float:
    """A parameter: a number, or `1/sqrt(SIZE)` / `rsqrt(SIZE)` of a fixed size."""
    raw = spec.params[name]
    if isinstance(raw, (int, float)):
        if not math.isfinite(raw):
            raise SpecError(f"params.{name}", f"must be finite, got {raw}")
        return float(raw)
    m = re.fullmatch(r"\s*(?:1\s*/\s*sqrt|rsqrt)\(\s*([A-Za-z_]\w*)\s*\)\s*", raw)
    if not m:
        raise SpecError(f"params.{name}", f"expected a number or 1/sqrt(SIZE), got {raw!r}")
    size = spec.sizes.get(m.group(1))
    if not isinstance(size, int):
        raise SpecError(f"params.{name}", f"{m.group(1)} must be a fixed size to use it in a parameter")
    return 1.0 / math.sqrt(size)
