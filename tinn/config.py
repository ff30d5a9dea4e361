"""tcnn-style JSON configs: loading (comments allowed) and validated field access.

Every accessor raises `ConfigError` naming the full key path (e.g.
`network.n_neurons`) and the allowed values, so a bad config never turns into a
silent default or a crash deep inside a kernel.
"""
from __future__ import annotations

import copy
import difflib
import importlib.resources
import json
import math
import numbers
import os
from typing import Any, Iterable, Mapping

from .errors import ConfigError


def strip_json_comments(text: str) -> str:
    """Remove `//`, `#` and `/* */` comments outside strings (what commentjson accepts)."""
    out, i, n = [], 0, len(text)
    in_string = False
    while i < n:
        c = text[i]
        if in_string:
            out.append(c)
            if c == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 2
                continue
            if c == '"':
                in_string = False
            i += 1
        elif c == '"':
            in_string = True
            out.append(c)
            i += 1
        elif text.startswith("//", i) or c == "#":
            while i < n and text[i] != "\n":
                i += 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                raise ConfigError("unterminated /* comment in config")
            out.append("\n" * text.count("\n", i, end))  # keep line numbers for JSON errors
            i = end + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def loads(text: str, source: str = "<string>") -> dict:
    try:
        data = json.loads(strip_json_comments(text))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{source}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a JSON object, got {type(data).__name__}")
    return data


def shipped_config_names() -> list[str]:
    """File names of the configs that ship inside the package (`tinn/configs/*.json`)."""
    folder = importlib.resources.files(__package__).joinpath("configs")
    return sorted(entry.name for entry in folder.iterdir() if entry.name.endswith(".json"))


def shipped_config_path(name: str) -> str:
    """Path of a config that ships inside the package, by file name ("config_hash.json"; ".json" optional).

    Raises:
        ConfigError: no shipped config has that name (the message lists those that exist).
    """
    file_name = name if name.endswith(".json") else name + ".json"
    names = shipped_config_names()
    if file_name not in names:
        raise ConfigError(f"no shipped config named {name!r}; shipped configs: {', '.join(names)}")
    # The package is installed as plain files (no zip import), so the resource is a real path.
    return str(importlib.resources.files(__package__).joinpath("configs", file_name))


def load_config(path: str | os.PathLike) -> dict:
    """Load a tcnn-style JSON config (comments allowed) as a dict.

    Args:
        path: a JSON file, or the bare name of a config shipped with tinn ("config.json",
            "config_hash"; see `shipped_config_names()`), used when no file of that name exists
            here, so that an installed tinn finds its own configs from any directory.

    Returns:
        The parsed config: a dict with the tcnn sections (`loss`, `optimizer`, `encoding`, `network`).

    Raises:
        ConfigError: the file is not valid JSON, its top level is not an object, or a bare name
            matches no file and no shipped config.
        OSError: the file exists but cannot be read.
    """
    text_path = os.fspath(path)
    if not os.path.exists(text_path) and os.path.basename(text_path) == text_path:
        try:
            text_path = shipped_config_path(text_path)
        except ConfigError:
            raise ConfigError(f"{text_path!r}: no such file here, and no shipped config of that name; shipped "
                              f"configs: {', '.join(shipped_config_names())}") from None
    with open(text_path, "r", encoding="utf-8") as f:
        return loads(f.read(), source=str(path))


def unknown_key_message(key_path: str, key: str, allowed: Iterable[str], owner: str) -> str:
    """The one wording of an unknown-key error: full path, owner, allowed keys and the closest match."""
    allowed = sorted(allowed)
    text = f"{key_path} is not an option of {owner}; allowed: {allowed}"
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    return text + (f"; did you mean {close[0]!r}?" if close else "")


class Section:
    """Validated read access to one config object, remembering its key path for errors.

    Unknown keys: the factory that knows the section's type calls `expect_keys` with every key that
    type reads (its class's `OPTIONS` plus "otype"), so a typo is an error rather than a silent default.
    From then on reading a key outside that set is a programming error (the declaration and the code
    that reads the config cannot drift apart). `extra_keys` are keys an enclosing section reads from
    this one (e.g. a Composite's `n_dims_to_encode` in each nested encoding).
    """

    def __init__(self, data: Mapping[str, Any] | None, path: str, extra_keys: Iterable[str] = ()):
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path} must be a JSON object, got {type(data).__name__}")
        self.data = dict(data)
        self.path = path
        self.extra_keys = tuple(extra_keys)
        self.declared: frozenset[str] | None = None

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def expect_keys(self, keys: Iterable[str], owner: str) -> None:
        """Reject every key of this section outside `keys` (and `extra_keys`), naming the owner
        (e.g. "'Adam'") in the error."""
        allowed = set(keys) | set(self.extra_keys)
        for key in self.data:
            if key not in allowed:
                raise ConfigError(unknown_key_message(self.key(key), key, allowed, owner))
        self.declared = frozenset(allowed)

    def _read(self, name: str) -> None:
        if self.declared is not None and name not in self.declared:
            raise TypeError(f"{self.key(name)} is read but not declared: add {name!r} to the OPTIONS of the "
                            "class that reads it")

    def has(self, name: str) -> bool:
        self._read(name)
        return name in self.data

    def otype(self, allowed: Iterable[str], default: str | None = None) -> str:
        """The canonical spelling of `otype` (matched case-insensitively, as tcnn does)."""
        return self.choice("otype", allowed, default)

    def choice(self, name: str, allowed: Iterable[str], default: str | None = None) -> str:
        allowed = list(allowed)
        self._read(name)
        value = self.data.get(name, default)
        if value is None and default is None and name not in self.data:
            raise ConfigError(f"{self.key(name)} is missing; allowed: {allowed}")
        if value is None:
            value = "None"
        if not isinstance(value, str):
            raise ConfigError(f"{self.key(name)}={value!r} must be a string; allowed: {allowed}")
        for a in allowed:
            if a.lower() == value.lower():
                return a
        raise ConfigError(f"{self.key(name)}={value!r} is not supported; allowed: {allowed}")

    def integer(self, name: str, default: int | None = None, lo: int | None = None, hi: int | None = None,
                allowed: Iterable[int] | None = None) -> int:
        value = self._get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise ConfigError(f"{self.key(name)}={value!r} must be an integer{_range_text(lo, hi, allowed)}")
        value = int(value)
        self._check_range(name, value, lo, hi, allowed)
        return value

    def number(self, name: str, default: float | None = None, lo: float | None = None, hi: float | None = None,
               lo_open: bool = False) -> float:
        value = self._get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{self.key(name)}={value!r} must be a finite number{_range_text(lo, hi, None)}")
        value = float(value)
        if lo is not None and (value < lo or (lo_open and value == lo)):
            bound = f"> {lo}" if lo_open else f">= {lo}"
            raise ConfigError(f"{self.key(name)}={value!r} is out of range; allowed: {bound}"
                              + (f" and <= {hi}" if hi is not None else ""))
        if hi is not None and value > hi:
            raise ConfigError(f"{self.key(name)}={value!r} is out of range; allowed: <= {hi}")
        return value

    def boolean(self, name: str, default: bool | None = None) -> bool:
        value = self._get(name, default)
        if not isinstance(value, bool):
            raise ConfigError(f"{self.key(name)}={value!r} must be true or false")
        return value

    def section(self, name: str, required: bool = True) -> "Section":
        self._read(name)
        if name not in self.data:
            if required:
                raise ConfigError(f"{self.key(name)} is missing (a JSON object is required)")
            return Section({}, self.key(name))
        return Section(self.data[name], self.key(name))

    def _get(self, name: str, default):
        self._read(name)
        if name in self.data:
            return self.data[name]
        if default is None:
            raise ConfigError(f"{self.key(name)} is missing")
        return default

    def _check_range(self, name, value, lo, hi, allowed):
        if allowed is not None and value not in set(allowed):
            raise ConfigError(f"{self.key(name)}={value!r} is not supported; allowed: {sorted(allowed)}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise ConfigError(f"{self.key(name)}={value!r} is out of range{_range_text(lo, hi, None)}")


def expect_options(cfg: Section, cls: type, otype: str) -> None:
    """What every factory calls once it knows the section's type: `cls.OPTIONS` lists each key the
    type's config may hold besides "otype" (keys tinn accepts but ignores included, spelled out)."""
    options = getattr(cls, "OPTIONS", None)
    if options is None:
        raise TypeError(f"{cls.__name__} must declare OPTIONS, the config keys it reads")
    cfg.expect_keys(("otype", *options), repr(otype))


def count(name: str, value, lo: int = 1, hi: int | None = None) -> int:
    """A count argument (n_networks, n_input_dims, widths, levels, ...) given in code rather than JSON:
    an integer (bool refused: True would silently mean 1) within [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name}={value!r} must be an integer{_range_text(lo, hi, None)}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        raise ConfigError(f"{name}={value!r} is out of range{_range_text(lo, hi, None)}")
    return value


def _range_text(lo, hi, allowed) -> str:
    if allowed is not None:
        return f"; allowed: {sorted(allowed)}"
    parts = []
    if lo is not None:
        parts.append(f">= {lo}")
    if hi is not None:
        parts.append(f"<= {hi}")
    return ("; allowed: " + " and ".join(parts)) if parts else ""


def merged(base: Mapping, **overrides) -> dict:
    """A deep copy of `base` with top-level keys replaced."""
    out = copy.deepcopy(dict(base))
    out.update(overrides)
    return out
