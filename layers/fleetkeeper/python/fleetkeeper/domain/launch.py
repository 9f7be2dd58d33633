"""What a stage may launch: the instance types its settings name (cdk.json `instance_types`).

The same list bounds the reconciler's RunInstances grant (an ec2:InstanceType condition), so a template
of another type could never launch on AWS; the API refuses it when it is written, and the reconciler
fails a worker whose template no longer qualifies, each with a reason naming the list.
"""

from __future__ import annotations

from collections.abc import Collection


def refused_instance_type(instance_type: str, allowed: Collection[str]) -> str | None:
    """Why the stage may not launch this instance type; None when it may (an empty list bounds nothing)."""
    if not allowed or instance_type in allowed:
        return None
    return (
        f"'{instance_type}' is not an instance type this stage may launch; it may launch "
        f"{', '.join(sorted(allowed))} (instance_types in the stage's settings)"
    )
