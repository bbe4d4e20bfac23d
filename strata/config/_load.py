"""Loading a pipeline's configuration: YAML files in layers, environment variables, errors.

`conf/strata.yaml` holds defaults shared by every pipeline (warehouse root, Kafka
client, storage options); `conf/pipelines/NAME.yaml` holds one pipeline and may
override any of them. `conf/local/*.yaml` (git-ignored) is merged last, for local
overrides and secrets. String values may reference environment variables as
`${NAME}` so secrets never live in committed files.

Three environment variables override the configuration, so the same files run
locally and in production: `STRATA_KAFKA_BOOTSTRAP` (the broker list),
`STRATA_WAREHOUSE` (the warehouse root that relative table locations hang from) and
`STRATA_METASTORE_URI`.

An error names the file, the key and the fix, never a secret: every secret a loaded
file holds is remembered (`strata.config.secrets`), so that `redact` removes it from
any text.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from strata.config._model import PipelineConfig
from strata.config.secrets import redact, remember_secrets
from strata.errors import ConfigError
from strata.store.places import Namespace

ENV_BOOTSTRAP = "STRATA_KAFKA_BOOTSTRAP"
ENV_WAREHOUSE = "STRATA_WAREHOUSE"
ENV_METASTORE = "STRATA_METASTORE_URI"
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _expand_env(value: Any, source: Path, key: str) -> Any:  # noqa: ANN401 - YAML is untyped
    if isinstance(value, dict):
        return {
            k: _expand_env(v, source, f"{key}.{k}" if key else str(k)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_expand_env(v, source, f"{key}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, str):

        def sub(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in os.environ:
                raise ConfigError(
                    f"{source}: key `{key}` refers to environment variable ${{{name}}}, "
                    f"which is not set; export {name} or remove the reference"
                )
            return os.environ[name]

        return _ENV_REF.sub(sub, value)
    return value


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}: line {line} is not UTF-8 text; save the file as UTF-8"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        # `from None`: the YAML error's own text, shown in any traceback of its cause,
        # quotes the broken line.
        raise ConfigError(_yaml_error(path, text, exc)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top level")
    return dict(_expand_env(data, path, ""))


# A quoted fragment of PyYAML's problem text: one character ('\t') or file content.
_QUOTED = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"")


def _one_character(fragment: re.Match[str]) -> str:
    """Keep a quoted single character (a tab, a stray ':'); hide longer file content."""
    try:
        shown = ast.literal_eval(fragment.group())
    except (ValueError, SyntaxError):
        shown = None
    return fragment.group() if isinstance(shown, str) and len(shown) == 1 else "'...'"


def _yaml_error(path: Path, text: str, exc: yaml.YAMLError) -> str:
    """Where and why a file is not valid YAML, without showing the line.

    PyYAML's own message quotes the offending line, and a line of a config file may
    hold a password: this names the file, the line, the column and the problem only.
    """
    line: int | None = None
    column: int | None = None
    problem = type(exc).__name__
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        line, column = exc.problem_mark.line + 1, exc.problem_mark.column + 1
        problem = exc.problem or problem
        start = exc.context_mark
        if exc.context and start is not None:
            # An unclosed quote is found at the end of the file: say where it began.
            where = f"line {start.line + 1}, column {start.column + 1}"
            problem += f" ({exc.context} begun at {where})"
    elif isinstance(exc, yaml.reader.ReaderError):
        line = text[: exc.position].count("\n") + 1
        problem = "a control character is not allowed in YAML"
    where = f" at line {line}" if line else ""
    where += f", column {column}" if column else ""
    return (
        f"{path}: not valid YAML{where}: {_QUOTED.sub(_one_character, problem)}. "
        "Fix the syntax there (a value holding ': ', ' #', or starting with a special "
        "character such as *, &, !, %, @ or a quote needs quotes around it); the line is "
        "not shown, since it may hold a secret"
    )


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _origin(key_path: tuple[Any, ...], layers: list[tuple[Path, dict[str, Any]]]) -> Path:
    """The last file that set a key, so the error names the file to edit."""
    for path, data in reversed(layers):
        node: Any = data
        for part in key_path:
            if isinstance(node, dict) and part in node:
                node = node[part]
            else:
                break
        else:
            return Path(path)
    return Path(layers[-1][0])


def load_pipeline(name: str, conf_dir: str | Path = "conf") -> PipelineConfig:
    """Load, merge and validate a pipeline's configuration.

    The pipeline's tables are checked against those of the other pipelines of the
    directory (`strata.store.places`): a place or metastore name two of them claim is
    refused, naming both owners and the keys that part them.

    Args:
        name: Pipeline name; the file `conf_dir/pipelines/NAME.yaml` must exist.
            `NAME:TABLE` names one table of a pipeline that routes its topics to
            tables (see `RoutingConfig`).
        conf_dir: The configuration directory.

    Returns:
        The validated configuration, with environment overrides applied.

    Raises:
        ConfigError: With the file, the key and the fix, if anything is wrong.
    """
    if ":" in name:
        parent, table = name.split(":", 1)
        cfg = load_pipeline(parent, conf_dir)
        if not cfg.routed:
            raise ConfigError(
                f"pipeline {parent} does not route its topics to tables (no `routing` key); "
                f"name it as {parent}"
            )
        routed = cfg.route(table)
        found = Namespace(cfg.neighbours).clashes(routed.owned_tables())
        if found:
            raise ConfigError(f"pipeline {parent}, table {table}: " + "\n  ".join(found))
        return routed
    loaded = load_pipelines(conf_dir, [name])[name]
    if isinstance(loaded, ConfigError):
        raise loaded
    return loaded


def load_pipelines(
    conf_dir: str | Path = "conf", names: list[str] | None = None
) -> dict[str, PipelineConfig | ConfigError]:
    """Load several pipelines of a directory, each file read once, each checked against all.

    Args:
        conf_dir: The configuration directory.
        names: The pipelines wanted; every pipeline of the directory by default.

    Returns:
        Per pipeline wanted, its configuration, or the error that names its file, the
        key and the fix (a clash with another pipeline's tables among them).
    """
    every = list_pipelines(conf_dir)
    wanted = every if names is None else names
    loaded: dict[str, PipelineConfig | ConfigError] = {}
    # The others are read too, to check the wanted ones' tables against theirs; one that
    # does not load is left out here (its own load names its problem).
    for name in dict.fromkeys([*wanted, *every]):
        try:
            loaded[name] = _load_file(name, conf_dir)
        except ConfigError as exc:
            loaded[name] = exc
    tables = {
        name: cfg.every_table() for name, cfg in loaded.items() if isinstance(cfg, PipelineConfig)
    }
    out: dict[str, PipelineConfig | ConfigError] = {}
    for name in wanted:
        cfg = loaded[name]
        if isinstance(cfg, ConfigError):
            out[name] = cfg
            continue
        neighbours = tuple(t for other, ts in tables.items() if other != name for t in ts)
        found = Namespace(neighbours).clashes(tables[name])
        if found:
            file = Path(conf_dir).resolve() / "pipelines" / f"{name}.yaml"
            out[name] = ConfigError(
                f"{file}: the tables of pipeline {name} clash with another pipeline's of "
                f"{file.parent}:\n  " + "\n  ".join(found)
            )
            continue
        cfg._neighbours = neighbours
        out[name] = cfg
    return out


def _load_file(name: str, conf_dir: str | Path) -> PipelineConfig:
    """Load, merge and validate one pipeline's files (see `load_pipeline`)."""
    conf = Path(conf_dir).resolve()
    pipeline_file = conf / "pipelines" / f"{name}.yaml"
    if not pipeline_file.is_file():
        known = sorted(p.stem for p in (conf / "pipelines").glob("*.yaml"))
        raise ConfigError(
            f"{pipeline_file}: no such pipeline file; known pipelines: {', '.join(known) or 'none'}"
        )
    layers: list[tuple[Path, dict[str, Any]]] = []
    defaults = conf / "strata.yaml"
    if defaults.is_file():
        layers.append((defaults, _read_yaml(defaults)))
    layers.append((pipeline_file, _read_yaml(pipeline_file)))
    local = conf / "local"
    if local.is_dir():
        for extra in sorted(local.glob("*.yaml")):
            layers.append((extra, _read_yaml(extra)))
    merged: dict[str, Any] = {}
    for _, data in layers:
        # Every layer's, as a secret a later file overrides may still sit in a message.
        remember_secrets(data)
        merged = _merge(merged, data)
    merged.setdefault("name", name)
    if merged["name"] != name:
        raise ConfigError(
            redact(
                f"{pipeline_file}: key `name` is {merged['name']!r} but the file is named "
                f"{name!r}; make them match or drop the key"
            )
        )
    # Relative paths in config are relative to the project root (conf's parent).
    root = conf.parent
    merged["schemas_dir"] = str((root / merged.get("schemas_dir", "schemas")).resolve())
    warehouse = os.environ.get(ENV_WAREHOUSE) or merged.get("warehouse", "warehouse")
    if "://" not in warehouse:
        warehouse = str((root / warehouse).resolve())
    merged["warehouse"] = warehouse
    if os.environ.get(ENV_METASTORE):
        merged["metastore"] = {**merged.get("metastore", {}), "uri": os.environ[ENV_METASTORE]}
    if os.environ.get(ENV_BOOTSTRAP):
        merged.setdefault("kafka", {})
        merged["kafka"] = {**merged["kafka"], "bootstrap_servers": os.environ[ENV_BOOTSTRAP]}
    remember_secrets(merged)  # the overrides' too
    try:
        return PipelineConfig.model_validate(merged)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            key = ".".join(str(p) for p in loc) or "(top level)"
            # A check across keys (loc `()`) belongs to the pipeline's own file.
            origin = _origin(loc, layers) if loc else pipeline_file
            fix = _fix_hint(err)
            # A validator's message may quote the value it refused (a URL with a password).
            lines.append(redact(f"{origin}: key `{key}`: {err['msg']}{fix}"))
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines)) from None


# The page that lists every key, generated from the model (`strata.reference`).
_REFERENCE = "docs/reference/configuration.md"


def _fix_hint(err: Any) -> str:  # noqa: ANN401 - pydantic's ErrorDetails
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        return (
            f"; remove it or check its spelling against the configuration reference ({_REFERENCE})"
        )
    if kind == "missing":
        return f"; add it (see the configuration reference, {_REFERENCE})"
    if kind == "literal_error":
        return ""
    return ""


def list_pipelines(conf_dir: str | Path = "conf") -> list[str]:
    """Names of every pipeline configured under `conf_dir/pipelines`."""
    return sorted(p.stem for p in (Path(conf_dir) / "pipelines").glob("*.yaml"))
