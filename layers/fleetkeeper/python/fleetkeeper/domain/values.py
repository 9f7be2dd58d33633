"""The value types every request reads alike, so one rule holds for each wherever a field takes it."""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import Field, Strict

# An integer is a JSON number written without a fraction part: 600, never 600.0, `true` or "600". JSON
# Schema would call 600.0 an integer too; the API refuses it rather than guess what a client that wrote
# a fraction meant. Bounds go after this, each field its own: Annotated[WholeNumber, Field(ge=1)].
WholeNumber = Annotated[int, Strict()]

MAX_REASON_LENGTH: Final = 500
# Why a caller asks for a change, kept in the audit trail: some text, or the key left out (or null).
Reason = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_REASON_LENGTH,
        description=f"why, for the audit trail: 1 to {MAX_REASON_LENGTH} characters; leave it out for none",
    ),
]
