"""Typed configs from YAML, validated before anything runs.

A config is a tree of frozen dataclasses. Each field's documentation is the string literal
right below it (the CleanRL/tyro convention); `describe` reads those from the source so the
docs live in exactly one place. Every error names the offending key in one line.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
import types
import typing
from functools import lru_cache
from pathlib import Path
from typing import Any

from ludus.errors import UserError


class ConfigError(UserError):
    """A config key is unknown, has the wrong type or an impossible value."""


@lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass: {field name: first line of the string under it}."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, after in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check (and gently convert: int -> float, list -> tuple) `value` against type `tp`."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(f"config key {key!r}: {value!r} is not a {_type_name(tp)}")
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"config key {key!r}: {value!r} is not one of {list(typing.get_args(tp))}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key {key!r}: expected a list, got {value!r}")
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise ConfigError(f"config key {key!r}: expected {len(args)} items, got {len(value)}")
        return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(args, value)))
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key!r}: expected a mapping, got {value!r}")
        return from_dict(tp, value, prefix=f"{key}.")
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config key {key!r}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config key {key!r}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key {key!r}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"config key {key!r}: expected a string, got {value!r}")
        return value
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(f"config key {key!r}: expected {_type_name(tp)}, got {value!r}")


def from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass `cls` from a nested dict; unknown keys and wrong types are refused."""
    if not isinstance(data, dict):
        raise ConfigError(f"config {prefix.rstrip('.') or 'root'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], list(fields), n=1)
        hint = f" (did you mean {prefix}{close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown config key {prefix}{unknown[0]!r}{hint}")
    kwargs = {name: _coerce(value, hints[name], prefix + name) for name, value in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"config {prefix.rstrip('.') or cls.__name__}: {exc}") from None


def to_dict(config: Any) -> dict[str, Any]:
    """A plain nested dict (tuples as lists) — for YAML/JSON."""
    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v
    return plain(config)


def parse_scalar(text: str) -> Any:
    """A `--set key=value` value: parsed as YAML (numbers, booleans, lists), else a string."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str) and _EXPONENT_NUMBER.match(value.strip()):
        return float(value)  # YAML 1.1 reads "2e-4" (no dot) as a string; on the command line it is a number
    return value


_EXPONENT_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` overrides to a nested dict (copying it).

    A list of named sections (the league's `roles`) is entered by name:
    `roles.prey.learner_share=3` sets the key of the entry whose `name` is 'prey'.
    """
    import copy

    data = copy.deepcopy(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"bad --set {item!r}: use key=value, e.g. --set ppo.learning_rate=3e-4")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        node = data
        for i, part in enumerate(parts[:-1]):
            where = ".".join(parts[:i + 1])
            if isinstance(node, list):
                child = _named_entry(node, part, item, ".".join(parts[:i]))
            else:
                child = node.get(part)
                if child is None:
                    child = node[part] = {}
            if isinstance(child, list):
                if i == len(parts) - 2:
                    raise ConfigError(f"bad --set {item!r}: {where!r} is a list; name one of its entries, "
                                      f"e.g. {where}.<name>.{parts[-1]}=...")
            elif not isinstance(child, dict):
                raise ConfigError(f"bad --set {item!r}: {where!r} is not a section")
            node = child
        node[parts[-1]] = parse_scalar(raw)
    return data


def _named_entry(entries: list, name: str, item: str, where: str) -> dict:
    """The entry of a list of named sections whose `name` is `name`, or a one-line error."""
    for entry in entries:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry
    have = ", ".join(str(e.get("name")) for e in entries if isinstance(e, dict)) or "none"
    raise ConfigError(f"bad --set {item!r}: no {where} entry named {name!r} (have: {have})")


def load_yaml(path: str | Path) -> dict[str, Any]:
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not UTF-8 text (byte {exc.start}): is it a YAML file?") from None
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "invalid YAML"
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {first}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping at the top level")
    return data


def describe(cls: type, instance: Any = None, prefix: str = "") -> list[tuple[str, Any, str]]:
    """Every key of a config tree: (dotted key, value or default, one-line doc)."""
    rows: list[tuple[str, Any, str]] = []
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    instance = instance if instance is not None else cls()
    for f in dataclasses.fields(cls):
        value = getattr(instance, f.name)
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            rows.append((prefix + f.name, "", docs.get(f.name, "")))
            rows.extend(describe(tp, value, prefix + f.name + "."))
        else:
            rows.append((prefix + f.name, to_dict(value) if isinstance(value, tuple) else value,
                         docs.get(f.name, "")))
    return rows
