"""Audit events on the EventBridge bus, and operator notifications on SNS."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

EVENT_SOURCE = "fleetkeeper"


class AuditBus:
    def __init__(self, client: Any, bus_name: str) -> None:
        self._client = client
        self._bus_name = bus_name

    def publish(self, detail_type: str, detail: Mapping[str, Any]) -> None:
        """Put one event; a rejected entry raises, so a lost audit event is never silent."""
        response = self._client.put_events(
            Entries=[
                {
                    "Source": EVENT_SOURCE,
                    "DetailType": detail_type,
                    "Detail": json.dumps(detail, default=str),
                    "EventBusName": self._bus_name,
                }
            ]
        )
        if response.get("FailedEntryCount"):
            entry = response["Entries"][0]
            raise RuntimeError(
                f"EventBridge rejected {detail_type}: {entry.get('ErrorCode')} {entry.get('ErrorMessage')}"
            )


class Notifier:
    def __init__(self, client: Any, topic_arn: str | None) -> None:
        self._client = client
        self._topic_arn = topic_arn

    def notify(self, subject: str, message: Mapping[str, Any]) -> bool:
        """Publish to the operators' topic; False when no topic is configured."""
        if not self._topic_arn:
            return False
        self._client.publish(
            TopicArn=self._topic_arn, Subject=subject[:100], Message=json.dumps(message, default=str)
        )
        return True
