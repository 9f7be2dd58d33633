"""CloudWatch alarms: which of some named alarms are in ALARM, in one call (a rollout's
`rollback_on_alarms`, docs/rollouts.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

# DescribeAlarms returns at most 100 alarms a page; a rollout names at most 10.
MAX_NAMES_PER_CALL: Final = 100


class AlarmsGateway:
    def __init__(self, client: Any) -> None:
        self._client = client

    def in_alarm(self, names: Sequence[str]) -> list[str]:
        """The names among `names` whose alarm (metric or composite) is in ALARM now, sorted; an alarm
        that does not exist is not in ALARM."""
        if not names:
            return []
        if len(names) > MAX_NAMES_PER_CALL:
            raise ValueError(f"at most {MAX_NAMES_PER_CALL} alarm names a call")
        response = self._client.describe_alarms(
            AlarmNames=list(names),
            StateValue="ALARM",
            AlarmTypes=["MetricAlarm", "CompositeAlarm"],
            MaxRecords=MAX_NAMES_PER_CALL,
        )
        alarms = [*response.get("MetricAlarms", []), *response.get("CompositeAlarms", [])]
        # The state is checked here too: the filter is the service's, the decision is ours.
        return sorted({a["AlarmName"] for a in alarms if a.get("StateValue") == "ALARM"})
