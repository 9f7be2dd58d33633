"""One Powertools Router per resource; api/app.py includes them all."""

from __future__ import annotations

import inspect
from typing import Any, Final

from aws_lambda_powertools.event_handler.api_gateway import Router

_ROUTE: Final = inspect.signature(Router.route)


class ResourceRouter(Router):
    """The routes of one resource: each is tagged with it, so Swagger UI and the contract group them,
    and the contract's `tags` list says what the resource is."""

    def __init__(self, tag: str, description: str) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # Powertools leaves __init__ unannotated
        self.tag = tag
        self.description = description

    def route(self, *args: Any, **kwargs: Any) -> Any:
        # Router.get/post/... pass every argument by position: bind them to set the one that matters.
        bound = _ROUTE.bind(self, *args, **kwargs)
        bound.arguments["tags"] = [self.tag]
        return super().route(*bound.args[1:], **bound.kwargs)
