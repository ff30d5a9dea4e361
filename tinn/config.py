"""tcnn-style JSON configs: loading (comments allowed) and validated field access.

Every accessor raises `ConfigError` naming the full key path (e.g.
`network.n_neurons`) and the allowed values, so a bad config never turns into a
silent default or a crash deep inside a kernel.
"""
from __future__ import annotations

import copy
import json
import math
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


def load_config(path: str | os.PathLike) -> dict:
    """Load a tcnn JSON config file (comments allowed) as a dict."""
    with open(path, "r", encoding="utf-8") as f:
        return loads(f.read(), source=str(path))


class Section:
    """Validated read access to one config object, remembering its key path for errors."""

    def __init__(self, data: Mapping[str, Any] | None, path: str):
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path} must be a JSON object, got {type(data).__name__}")
        self.data = dict(data)
        self.path = path

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def has(self, name: str) -> bool:
        return name in self.data

    def otype(self, allowed: Iterable[str], default: str | None = None) -> str:
        """The canonical spelling of `otype` (matched case-insensitively, as tcnn does)."""
        return self.choice("otype", allowed, default)

    def choice(self, name: str, allowed: Iterable[str], default: str | None = None) -> str:
        allowed = list(allowed)
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
        if name not in self.data:
            if required:
                raise ConfigError(f"{self.key(name)} is missing (a JSON object is required)")
            return Section({}, self.key(name))
        return Section(self.data[name], self.key(name))

    def _get(self, name: str, default):
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
