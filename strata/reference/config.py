"""The configuration reference: every key of `PipelineConfig`, its type, default and description.

The descriptions are the `Attributes:` sections of the models' docstrings, where a
reader of the code finds them too: one source, which `described` checks against the
models' fields, both ways.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Union

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

import strata.config._load
from strata.config import PipelineConfig
from strata.config._checks import Duration, Zone
from strata.reference._docstrings import paragraphs, section
from strata.reference._markdown import cell, code, generated, prose, table

# The constrained strings a key may be, by the validators that make them so.
_NAMED = {
    id(meta): name
    for alias, name in ((Duration, "duration"), (Zone, "time zone"))
    for meta in typing.get_args(alias)[1:]
}


# The bounds pydantic's `Field(gt=..., ...)` sets: how the type column writes each,
# and the attribute holding its value.
_BOUNDS: dict[type, tuple[str, str]] = {
    annotated_types.Gt: (">", "gt"),
    annotated_types.Ge: (">=", "ge"),
    annotated_types.Lt: ("<", "lt"),
    annotated_types.Le: ("<=", "le"),
    annotated_types.MinLen: ("length >=", "min_length"),
    annotated_types.MaxLen: ("length <=", "max_length"),
}


@dataclass(frozen=True)
class Key:
    """One key of the configuration.

    Attributes:
        path: Its dotted path, `*` standing for any name of a mapping's key and `[*]`
            for any item of a list, e.g. `quality.ranges.*.min`.
        type: Its type, readable (`int`, `list[str]`, `"delta" | "parquet"`).
        default: Its default as YAML, or `required`.
        description: What it does, from its model's docstring.
    """

    path: str
    type: str
    default: str
    description: str


@dataclass(frozen=True)
class Section:
    """The keys of one model, at one path of the configuration.

    Attributes:
        path: Where its keys hang, e.g. `kafka` (empty for the top level).
        model: The model.
        keys: Its keys, in the model's order.
    """

    path: str
    model: type[BaseModel]
    keys: tuple[Key, ...]


def _model_in(annotation: Any) -> tuple[type[BaseModel], str] | None:  # noqa: ANN401 - any type
    """The model a key holds, and how its keys hang under it (`""`, `.*`, `[*]`), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, ""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (Union, types.UnionType):
        models = [m for m in (_model_in(a) for a in args if a is not type(None)) if m]
        return models[0] if models else None
    if origin is dict and args:
        inner = _model_in(args[1])
        return (inner[0], ".*" + inner[1]) if inner else None
    if origin in (list, tuple) and args:
        inner = _model_in(args[0])
        return (inner[0], "[*]" + inner[1]) if inner else None
    return None


def type_name(annotation: Any, metadata: list[Any] | None = None) -> str:  # noqa: ANN401 - any type
    """A key's type as the reference writes it.

    Args:
        annotation: The type, as pydantic holds it.
        metadata: The validators pydantic took off its top-level `Annotated`.

    Returns:
        `int`, `list[str]`, `"delta" | "parquet"`, `duration`, `mapping` (a section), ...
    """
    for meta in metadata or []:
        if id(meta) in _NAMED:
            return _NAMED[id(meta)]
    bounds = [
        f"{_BOUNDS[type(m)][0]} {getattr(m, _BOUNDS[type(m)][1])}"
        for m in metadata or []
        if type(m) in _BOUNDS
    ]
    if bounds:
        return f"{type_name(annotation)} ({', '.join(bounds)})"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0], list(args[1:]))
    if annotation is type(None):
        return "None"
    if annotation is Any:
        return "any"
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin in (list, tuple):
        # A tuple of any length is written in YAML as a list.
        return f"list[{type_name(args[0])}]"
    if origin is dict:
        return f"dict[{type_name(args[0])}, {type_name(args[1])}]"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "its keys' defaults"
    if isinstance(value, tuple):
        value = list(value)
    dumped = yaml.safe_dump(value, default_flow_style=True, width=1_000_000)
    return code(dumped.removesuffix("\n").removesuffix("\n...").strip())


def described(model: type[BaseModel]) -> tuple[list[str], list[str]]:
    """Where a model's fields and its docstring's `Attributes:` disagree.

    Args:
        model: A configuration model.

    Returns:
        The fields its docstring does not describe (or describes with no text), and
        the names it describes that are no field of it.
    """
    docs = section(model.__doc__, "Attributes")
    undescribed = [name for name in model.model_fields if not docs.get(name)]
    unknown = [name for name in docs if name not in model.model_fields]
    return undescribed, unknown


def sections(model: type[BaseModel] = PipelineConfig, path: str = "") -> list[Section]:
    """A model's keys and, after them, each of the models it holds, depth first.

    Args:
        model: The model; the whole configuration by default.
        path: Where its keys hang.

    Returns:
        Its section, then its sub-sections'.
    """
    docs = section(model.__doc__, "Attributes")
    keys: list[Key] = []
    nested: list[Section] = []
    for name, field in model.model_fields.items():
        key = f"{path}.{name}" if path else name
        keys.append(
            Key(
                key,
                type_name(field.annotation, field.metadata),
                _default(field),
                docs.get(name, ""),
            )
        )
        inner = _model_in(field.annotation)
        if inner is not None:
            nested += sections(inner[0], key + inner[1])
    return [Section(path, model, tuple(keys)), *nested]


def keys() -> list[Key]:
    """Every key of the configuration, in the page's order."""
    return [k for s in sections() for k in s.keys]


def _intro() -> str:
    """How the configuration is put together, from the loader's docstring."""
    layers = [prose(p) for p in paragraphs(strata.config._load.__doc__)[1:]]
    return "\n\n".join(
        [
            *layers,
            "Each key below is written as its dotted path: `kafka.timeout_s` is `timeout_s` "
            "under `kafka:`. In a path, `*` stands for any name of a mapping (a column, a "
            "topic) and `[*]` for any item of a list. Types are written as in Python: "
            '`str | None` may be left unset (`null`), `"dt" | "dt_hr"` takes one of the '
            "values shown, a `duration` is a whole number and a unit (`ms`, `s`, `m`, `h` "
            "or `d`: `90s`, `2h`, `7d`) and a `time zone` an IANA name (`Europe/Berlin`).",
        ]
    )


def page() -> str:
    """The page `configuration.md`."""
    out = [
        "# Configuration reference",
        generated("the configuration model, `strata.config.PipelineConfig`, and its docstrings"),
        _intro(),
    ]
    for part in sections():
        title = "Pipeline keys" if not part.path else f"`{part.path}`"
        out += [f"## {title}", *map(prose, paragraphs(part.model.__doc__))]
        rows = [
            (
                code(k.path),
                code(k.type),
                k.default,
                cell(
                    k.description
                    + (
                        f" Its keys are in `{k.path}` below."
                        if k.type.startswith("mapping")
                        else ""
                    )
                ),
            )
            for k in part.keys
        ]
        out.append(table(("Key", "Type", "Default", "Description"), rows))
    return "\n\n".join(out) + "\n"
