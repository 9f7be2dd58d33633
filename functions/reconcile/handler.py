"""PLACEHOLDER for the reconcile Lambda entry point, so the infrastructure synthesizes.

The real handler, written on its own branch, replaces this file at merge.
"""

from __future__ import annotations

from typing import Any


def handler(event: dict[str, Any], context: Any) -> Any:
    raise NotImplementedError("the reconcile handler is not merged yet")
