"""The metrics a handler published: the EMF lines Powertools prints when an invocation ends."""

from __future__ import annotations

import json
from collections import Counter


def metric_totals(output: str) -> Counter[str]:
    """Each metric's values summed over every EMF line in `output` (captured stdout)."""
    totals: Counter[str] = Counter()
    for line in output.splitlines():
        if not line.startswith('{"_aws"'):
            continue
        record = json.loads(line)
        for directive in record["_aws"]["CloudWatchMetrics"]:
            for metric in directive["Metrics"]:
                value = record[metric["Name"]]
                totals[metric["Name"]] += int(sum(value) if isinstance(value, list) else value)
    return totals
