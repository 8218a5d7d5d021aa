"""One-line checks of config values, one helper per kind of check.

Each failure is a ValueError naming the key as the user types it, the value and what is
allowed: `model.d_model must be a positive integer, got 0`. The helpers check types as well
as ranges because `harness.model.validate` is also called on configs built in Python, where
Hydra's schema has not already enforced the types.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NoReturn

# Ranges that read better as words than as intervals.
_NAMED_INTERVALS = {"(0, inf)": "a positive number", "[0, inf)": "a non-negative number"}


def fail(key: str, allowed: str, value: Any) -> NoReturn:
    raise ValueError(f"{key} must be {allowed}, got {value!r}")


def _or_null(allowed: str, nullable: bool) -> str:
    return f"{allowed} or null" if nullable else allowed


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # True is an int in Python


# Every integer a config holds becomes a size, an index or a seed of torch, all signed 64-bit: a
# larger one cannot become any (model.options.window = 10^20 trained, then failed with an OverflowError
# while measuring), so it is refused with the rest of the config.
INT64_MAX = 2**63 - 1


def _int_kind(minimum: int, maximum: int | None) -> str:
    if maximum is not None:
        return f"an integer in [{minimum}, {maximum}]"
    named = {1: "a positive integer", 0: "a non-negative integer"}
    return named.get(minimum, f"an integer >= {minimum}")


def _too_large(value: Any, maximum: int | None) -> bool:
    return _is_int(value) and value > (INT64_MAX if maximum is None else maximum)


def _int_allowed(minimum: int, maximum: int | None, value: Any) -> str:
    """What an integer check allows, naming the 64-bit bound only to a value past it."""
    if maximum is None and _too_large(value, None):
        return f"{_int_kind(minimum, None)} below 2**63 (torch's integers are 64-bit)"
    return _int_kind(minimum, maximum)


def integer(key: str, value: Any, minimum: int = 1, *, maximum: int | None = None,
            nullable: bool = False) -> None:
    if value is None and nullable:
        return
    if not _is_int(value) or value < minimum or _too_large(value, maximum):
        fail(key, _or_null(_int_allowed(minimum, maximum, value), nullable), value)


def number(key: str, value: Any, interval: str, *, nullable: bool = False) -> None:
    """A finite number in `interval`, written as in maths: "(0, 1]", "[0, inf)"."""
    if value is None and nullable:
        return
    low, high = (float(bound) for bound in interval[1:-1].split(","))
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if interval[0] == "(" else value >= low)
    ok = ok and (value < high if interval[-1] == ")" else value <= high)
    if not ok:
        fail(key, _or_null(_NAMED_INTERVALS.get(interval, f"a number in {interval}"), nullable), value)


def boolean(key: str, value: Any, *, nullable: bool = False) -> None:
    if not (isinstance(value, bool) or (value is None and nullable)):
        fail(key, _or_null("true or false", nullable), value)


def choice(key: str, value: Any, valid: Sequence[str], *, nullable: bool = False) -> None:
    if value is None and nullable:
        return
    if not isinstance(value, str) or value not in valid:
        raise ValueError(f"unknown {key} {value!r}; valid: {', '.join(valid)}")


def text(key: str, value: Any, *, max_len: int | None = None, forbidden: str = "",
         nullable: bool = False) -> None:
    """A non-empty string, at most `max_len` long, without any character of `forbidden`."""
    if value is None and nullable:
        return
    ok = isinstance(value, str) and value != "" and not any(c in value for c in forbidden)
    if not ok or (max_len is not None and len(value) > max_len):
        allowed = "a non-empty string"
        if max_len is not None:
            allowed += f" of at most {max_len} characters"
        if forbidden:
            allowed += f" without any of {' '.join(forbidden)}"
        fail(key, _or_null(allowed, nullable), value)


def int_list(key: str, values: Any, minimum: int = 1, *, nullable: bool = False) -> None:
    if values is None and nullable:
        return
    if not isinstance(values, (list, tuple)) or not values or not all(
            _is_int(v) and minimum <= v <= INT64_MAX for v in values):
        big = " below 2**63" if isinstance(values, (list, tuple)) and any(_too_large(v, None) for v in values) else ""
        fail(key, _or_null(f"a non-empty list of integers >= {minimum}{big}", nullable), values)


def choice_list(key: str, values: Any, valid: Sequence[str], empty: bool = False) -> None:
    """A list of names drawn from `valid`; non-empty unless `empty`."""
    if not isinstance(values, (list, tuple)) or not (values or empty) or not all(v in valid for v in values):
        fail(key, f"a {'' if empty else 'non-empty '}list drawn from {', '.join(valid)}", values)


def schema_keys(prefix: str, node: Any, fields: set[str]) -> None:
    """Exactly the schema's keys: Hydra's `+key=value` can add one and `~key` remove one."""
    section = prefix.rstrip(".")
    if not isinstance(node, dict):
        raise ValueError(f"{section} is not set, got {node!r}; choose it with {section}=<name>")
    unknown, missing = sorted(set(node) - fields), sorted(fields - set(node))
    if unknown:
        raise ValueError(f"unknown key '{prefix}{unknown[0]}'; "
                         f"valid keys here: {', '.join(sorted(fields))}")
    if missing:
        raise ValueError(f"missing key '{prefix}{missing[0]}'; it cannot be removed (~), only set")


def require(ok: bool, message: str) -> None:
    """A relation between keys; `message` names every key involved and their values."""
    if not ok:
        raise ValueError(message)
