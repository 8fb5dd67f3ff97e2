"""Validation of every name that reaches the catalog, the file system or Redis keys.

One rule for all: lower-case ASCII letters, digits and '_', starting with a letter or '_', at most
63 characters. No dots, slashes, braces or colons, so a name can never escape its namespace,
directory or Redis hash tag.
"""

from __future__ import annotations

import re

from service.core.exceptions import InvalidName

NAME_PATTERN = r"^[a-z_][a-z0-9_]{0,62}$"
_NAME = re.compile(NAME_PATTERN)
RULE = "lower-case letters, digits and '_', not starting with a digit, 1 to 63 characters"


def is_valid_name(value: str) -> bool:
    return bool(_NAME.fullmatch(value))  # fullmatch: "$" alone lets a trailing newline through


def validate_name(kind: str, value: str) -> str:
    if not isinstance(value, str) or not is_valid_name(value):
        shown = value if isinstance(value, str) and len(value) <= 80 else f"{str(value)[:80]}..."
        raise InvalidName(f"invalid {kind} name {shown!r}: use {RULE}")
    return value
