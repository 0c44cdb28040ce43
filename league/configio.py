"""Typed configs from YAML, validated before anything runs.

A config is a tree of frozen dataclasses. Each field's documentation is the string literal
right below it (the CleanRL/tyro convention); `describe` reads those from the source so the
docs live in exactly one place. Every error names the offending key in one line.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import re
import textwrap
import types
import typing
from functools import lru_cache
from pathlib import Path
from typing import Any

from ludus.bounds import Range, range_of, range_problem
from ludus.errors import UserError

MAX_CONFIG_BYTES = 1 << 20
"""Largest config file read (1 MiB; the biggest preset is ~1 kB as YAML)."""
MAX_CONFIG_DEPTH = 50
"""Deepest nesting of mappings and lists a config file or `--set` value may have (the deepest key
of the config tree is 5 levels down)."""
MAX_CONFIG_ENTRIES = 100_000
"""Most values (mapping entries and list items, counted along every path) a config may hold."""


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
        present = [option for option in options if option is not type(None)]
        if len(present) == 1:  # `X | None`: X's own message (a range, a nested key) says more
            return _coerce(value, present[0], key)
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
            return tuple(_coerce(v, args[0], _item_key(key, i, v)) for i, v in enumerate(value))
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


def _item_key(key: str, index: int, item: Any) -> str:
    """The key of a list's item: `roles.main` for a named section (as `--set` spells it), else `key[i]`."""
    name = item.get("name") if isinstance(item, dict) else None
    return f"{key}.{name}" if isinstance(name, str) and name else f"{key}[{index}]"


def from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass `cls` from a nested dict; unknown keys and wrong types are refused."""
    if not isinstance(data, dict):
        raise ConfigError(f"config {prefix.rstrip('.') or 'root'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        name = str(unknown[0])
        # at the top, a key of one of the sections spelt right comes first: learning_rate -> ppo.learning_rate
        nested = _nested_keys(cls) if not prefix else []
        close = next((key for key in nested if key.rsplit(".", 1)[-1] == name), None)
        if close is None:
            close = suggest_key(name, list(fields))
            close = prefix + close if close else suggest_key(name, nested, by_last_word=True)
        hint = f" (did you mean {close}?)" if close else ""
        raise ConfigError(f"unknown config key {prefix + str(unknown[0])!r}{hint}")
    kwargs = {name: _coerce(value, hints[name], prefix + name) for name, value in data.items()}
    for name, value in kwargs.items():
        problem = range_problem(fields[name], value, prefix + name, data[name])  # every field with a range
        if problem:
            raise ConfigError(problem)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"config {prefix.rstrip('.') or cls.__name__}: {exc}") from None


def _nested_keys(cls: type) -> list[str]:
    """The dotted keys below the top of config tree `cls` (none if it has no defaults to walk)."""
    try:
        return [key for key, value, _, _ in _rows(cls, None, "") if "." in key and value != ""]
    except (TypeError, ValueError, UserError):
        return []


def suggest_key(name: str, keys: list[str], by_last_word: bool = False) -> str | None:
    """The key `name` most likely misspells, or None: the key whose words' initials `name` is
    (lr -> learning_rate) or the other way round, else the closest by difflib, else the key one of
    whose words `name` is (epochs -> update_epochs). `by_last_word`: dotted keys, matched by their
    last part."""
    import difflib

    last = {(key.rsplit(".", 1)[-1] if by_last_word else key): key for key in reversed(keys)}  # the first key wins
    words = {word: [part for part in word.split("_") if part] for word in last}
    name_initials = "".join(part[0] for part in name.split("_") if part) if "_" in name else None
    initials = [word for word, parts in words.items()
                if (len(parts) > 1 and name == "".join(p[0] for p in parts)) or word == name_initials]
    close = initials or difflib.get_close_matches(name, list(last), n=1)
    close = close or [word for word, parts in words.items() if len(parts) > 1 and name in parts]
    return last[close[0]] if close else None


def to_dict(config: Any) -> dict[str, Any]:
    """A plain nested dict (tuples as lists) — for YAML/JSON."""
    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v
    return plain(config)


def dump_yaml(data: dict[str, Any]) -> str:
    """`data` as a YAML config file: sections in block style, lists of plain values on one line."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def sequence(dumper: yaml.SafeDumper, items: list) -> yaml.Node:
        flow = all(not isinstance(item, (dict, list)) for item in items)
        return dumper.represent_sequence("tag:yaml.org,2002:seq", items, flow_style=flow)

    Dumper.add_representer(list, sequence)
    return yaml.dump(data, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=110)


def parse_scalar(text: str) -> Any:
    """A `--set key=value` value: parsed as YAML (numbers, booleans, lists), else a string."""
    import yaml

    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"a --set value of {len(text):,} characters is too long (at most {MAX_CONFIG_BYTES:,})")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    except RecursionError:
        value = _too_deep("a --set value")
    _check_shape(value, "a --set value")
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
    """The top-level mapping of a YAML config file; an empty, oversized or too deeply nested file
    is refused in one line."""
    import yaml

    path = Path(path)
    name = str(path)
    if not path.is_file():
        raise ConfigError(f"config file {name!r} does not exist" if not path.exists() else
                          f"config file {name!r} is not a regular file; give a YAML file or a preset name")
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {name!r} has {size:,} bytes, more than a config's {MAX_CONFIG_BYTES:,}: "
                          f"is it a config file?")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {name!r} is not UTF-8 text (byte {exc.start}): is it a YAML file?") from None
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "invalid YAML"
        raise ConfigError(f"config file {name!r} is not valid YAML: {first}") from None
    except RecursionError:  # yaml's parser recurses once per level of nesting
        data = _too_deep(f"config file {name!r}")
    if data is None:
        raise ConfigError(f"config file {name!r} is empty: give at least the keys to change, e.g. "
                          f"'game: tic_tac_toe' (`ludus config show` lists them), or train a preset")
    if not isinstance(data, dict):
        raise ConfigError(f"config file {name!r} must hold a mapping at the top level")
    _check_shape(data, f"config file {name!r}")
    return data


def _too_deep(what: str) -> Any:
    raise ConfigError(f"{what} nests deeper than {MAX_CONFIG_DEPTH} levels: a config is a few levels of mappings")


def _check_shape(data: Any, what: str) -> None:
    """Refuse data nested deeper than MAX_CONFIG_DEPTH or with more than MAX_CONFIG_ENTRIES values
    (YAML aliases can repeat one list many times over: entries are counted along every path)."""
    stack, entries = [(data, 0)], 0
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = list(node.values())
        elif isinstance(node, (list, tuple)):
            children = list(node)
        else:
            continue
        if depth >= MAX_CONFIG_DEPTH:
            _too_deep(what)
        entries += len(children)
        if entries > MAX_CONFIG_ENTRIES:
            raise ConfigError(f"{what} holds more than {MAX_CONFIG_ENTRIES:,} values: a config holds a few hundred")
        stack.extend((child, depth + 1) for child in children)


def ranges(cls: type, instance: Any = None) -> dict[str, Range]:
    """The declared range of every numeric key of a config tree: {dotted key: Range} (a list of
    named sections, the league's `roles`, spelt as `--set` names them: roles.main.pfsp)."""
    return {key: valid for key, _, _, valid in _rows(cls, instance, "") if valid is not None}


def format_table(cls: type, instance: Any = None, keys: set[str] | None = None) -> str:
    """Every key of a config tree, one a line: key, value (default or given), valid range, doc;
    with `keys`, only those (no section headings: the dotted keys name their sections)."""
    rows = _rows(cls, instance, "")
    if keys is not None:
        rows = [row for row in rows if row[0] in keys]
    if not rows:
        return "(no keys)"
    width = max(len(key) for key, _, _, _ in rows)
    shown = [("" if value == "" else json.dumps(value), "" if valid is None else str(valid)) for _, value, _, valid in rows]
    value_width = min(22, max(len(v) for v, _ in shown))
    range_width = max(len(r) for _, r in shown)
    return "\n".join(f"{key:<{width}}  {value:<{value_width}} {valid:<{range_width}}  {doc}".rstrip()
                     for (key, _, doc, _), (value, valid) in zip(rows, shown))


def describe(cls: type, instance: Any = None, prefix: str = "") -> list[tuple[str, Any, str]]:
    """Every key of a config tree: (dotted key, value or default, one-line doc)."""
    return [(key, value, doc) for key, value, doc, _ in _rows(cls, instance, prefix)]


def _rows(cls: type, instance: Any, prefix: str) -> list[tuple[str, Any, str, Range | None]]:
    """(dotted key, value or default, one-line doc, declared range or None) of every key."""
    rows: list[tuple[str, Any, str, Range | None]] = []
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    instance = instance if instance is not None else cls()
    for f in dataclasses.fields(cls):
        value = getattr(instance, f.name)
        tp, key = hints[f.name], prefix + f.name
        if dataclasses.is_dataclass(tp) or dataclasses.is_dataclass(value):  # a section (or an optional one, set)
            rows.append((key, "", docs.get(f.name, ""), None))
            rows.extend(_rows(type(value) if value is not None else tp, value, key + "."))
            continue
        rows.append((key, to_dict(value) if isinstance(value, tuple) else value, docs.get(f.name, ""), range_of(f)))
        item_type = typing.get_args(tp)[0] if typing.get_origin(tp) is tuple and typing.get_args(tp) else None
        if dataclasses.is_dataclass(item_type):  # a list of named sections: each one's keys
            for i, item in enumerate(value):
                rows.extend(_rows(item_type, item, _item_key(key, i, to_dict(item)) + "."))
    return rows
