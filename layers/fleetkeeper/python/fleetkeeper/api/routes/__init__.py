"""One Powertools Router per resource; api/app.py includes them all."""

from __future__ import annotations

from aws_lambda_powertools.event_handler.api_gateway import Router


def new_router() -> Router:
    return Router()  # type: ignore[no-untyped-call]  # Powertools leaves __init__ unannotated
