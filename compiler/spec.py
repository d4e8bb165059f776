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

from .errors import SpecError, clip, did_you_mean, shown_value

MAX_YAML_DEPTH = 32  # nesting of mappings / lists in a schedule file
MAX_YAML_VALUES = 100_000  # scalars, lists and mappings of a schedule file, aliases expanded
MAX_SIZE = 2**31 - 1  # sizes index with 32-bit arithmetic in the kernels

Dtype = Literal["f16", "bf16", "f32", "f64"]
# an input may also hold integers (i32): read in conditions and as indices, never as a value
InputDtype = Literal["f16", "bf16", "f32", "f64", "i32"]
INT_DTYPES = ("i32",)


class TensorDecl(BaseModel):
    model_config = ConfigDict(extra="forbid")
    shape: list[str] = Field(min_length=1)
    dtype: InputDtype


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
    `1e-6` is a float and `0x80`, `yes`, `1:30` stay strings), merge keys are refused, and the
    document is bounded as it is composed, before anything is built from it: at most
    MAX_YAML_DEPTH levels and MAX_YAML_VALUES values, an alias counted as the whole value it
    stands for.  An alias bomb (nine aliases of nine aliases ..., 9^9 values in a few lines) is
    refused at the alias that crosses the bound; the aliases yaml.safe_dump writes for shared
    values (`&id001` / `*id001`) stay readable."""

    yaml_implicit_resolvers: dict = {}

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            event = self.peek_event()
            line = f"line {event.start_mark.line + 1}"
            if self._depth > MAX_YAML_DEPTH:
                raise SpecError(line, f"YAML nested deeper than {MAX_YAML_DEPTH} levels")
            node = super().compose_node(parent, index)
            self._bound(node, line, event)
            return node
        finally:
            self._depth -= 1

    def _bound(self, node: Any, line: str, event: Any) -> None:
        """Record the node's expanded size and height (its children are composed already);
        refuse a document that expands beyond the bounds, or an alias of a node it lies in."""
        expanded: dict[int, tuple[int, int]] = self.__dict__.setdefault("_expanded", {})
        alias = isinstance(event, yaml.AliasEvent)
        if alias and id(node) not in expanded:
            raise SpecError(line, f"YAML alias *{clip(event.anchor, 40)} refers to a value it lies inside "
                                  "(a recursive alias)")
        if not alias:
            kids = node.value if isinstance(node, yaml.SequenceNode) else \
                [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else []
            sizes = [expanded[id(k)] for k in kids]
            expanded[id(node)] = (1 + sum(n for n, _ in sizes), 1 + max((h for _, h in sizes), default=0))
        count, height = expanded[id(node)]
        total = self.__dict__.get("_total", 0) + (count if alias else 1)
        self._total = total
        what = f"the alias *{clip(event.anchor, 40)}" if alias else "the document"
        if total > MAX_YAML_VALUES:
            raise SpecError(line, f"YAML holds more than {MAX_YAML_VALUES} values, {what} counted expanded "
                                  "(an alias bomb?): refused before expanding it")
        if alias and self._depth - 1 + height > MAX_YAML_DEPTH:
            raise SpecError(line, f"YAML nested deeper than {MAX_YAML_DEPTH} levels through {what}")

    def construct_mapping(self, node: Any, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise SpecError(f"line {key_node.start_mark.line + 1}",
                                "YAML merge keys (<<:) are not supported: write the fields out")
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
                got = f"the string {shown_value(x)}" if isinstance(x, str) else f"{type(x).__name__} {shown_value(x)}"
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
        data = path.read_bytes()
    except OSError as exc:
        raise SpecError("file", f"cannot read: {exc.strerror}", str(path)) from None
    return parse_spec_text(decode_spec_bytes(data, str(path)), str(path))


def decode_spec_bytes(data: bytes, file: str) -> str:
    """The file's text: UTF-8 (a byte-order mark allowed), no NUL byte; else one SpecError."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise SpecError(f"line {line}", f"not UTF-8 text at byte {exc.start} ({data[exc.start:exc.start + 1]!r}): "
                                        "a schedule file is UTF-8 YAML", file) from None
    nul = data.find(b"\0")
    if nul >= 0:
        line = data[:nul].count(b"\n") + 1
        raise SpecError(f"line {line}", f"a NUL byte at byte {nul}: a binary file, not YAML text", file)
    return text


def parse_spec_text(text: str, file: str = "<string>") -> SpecFile:
    try:
        raw = yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except SpecError as exc:
        raise exc.in_file(file) from None
    except RecursionError:
        raise SpecError("yaml", f"nested too deeply (limit {MAX_YAML_DEPTH} levels)", file) from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow (a control character)
        line = text[:exc.position].count("\n") + 1
        char = exc.character if isinstance(exc.character, int) else ord(exc.character)
        raise SpecError(f"line {line}", f"character U+{char:04X} {chr(char)!r} (character {exc.position} of the "
                                        "file) is not allowed in YAML text", file) from None
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
