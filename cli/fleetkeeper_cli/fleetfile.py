"""`fleetkeeper apply -f fleet.yaml`: the declared templates and pools, their diff and its application.

Applying is idempotent: only what differs from the API's current answer is written, so a second apply
of the same file changes nothing. Nothing is deleted: a template or pool missing from the file is left
as it is (workers may still use it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from fleetkeeper_cli.client import CliError, ExitCode

if TYPE_CHECKING:
    from fleetkeeper_cli.client import ApiClient

TEMPLATE_FIELDS = (
    "instance_type",
    "ami_name_filter",
    "capacity",
    "drain_timeout_hours",
    "tags",
    "before_stop",
    "max_lifetime_hours",
    "auto_rollout",
)
POOL_FIELDS = ("description", "status", "disruption")
TEMPLATE_DEFAULTS: dict[str, Any] = {
    "drain_timeout_hours": 4,
    "tags": {},
    "max_lifetime_hours": None,
    "auto_rollout": False,
}
Kind = Literal["template", "pool"]


@dataclass(frozen=True)
class Change:
    kind: Kind
    name: str
    action: Literal["create", "update", "unchanged"]
    fields: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # field -> (current, desired)
    body: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "action": self.action,
            "fields": {k: {"from": old, "to": new} for k, (old, new) in self.fields.items()},
        }


@dataclass(frozen=True)
class FleetFile:
    templates: dict[str, dict[str, Any]]
    pools: dict[str, dict[str, Any]]


def _entries(
    data: dict[str, Any], section: str, allowed: tuple[str, ...], source: str
) -> dict[str, dict[str, Any]]:
    raw = data.get(section) or []
    if not isinstance(raw, list):
        raise CliError(f"{source}: '{section}' must be a list", ExitCode.USAGE)
    entries: dict[str, dict[str, Any]] = {}
    for index, entry in enumerate(raw):
        where = f"{source}: {section}[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise CliError(f"{where}: each entry is a mapping with a 'name'", ExitCode.USAGE)
        unknown = sorted(set(entry) - {"name", *allowed})
        if unknown:
            raise CliError(
                f"{where}.{unknown[0]}: unknown field (known: {', '.join(allowed)})", ExitCode.USAGE
            )
        name = entry["name"]
        if name in entries:
            raise CliError(f"{where}.name: '{name}' is declared twice", ExitCode.USAGE)
        entries[name] = {k: v for k, v in entry.items() if k != "name"}
    return entries


def load(path: Path) -> FleetFile:
    import yaml  # noqa: PLC0415 - only `apply` reads YAML; every other command starts without it

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", ExitCode.USAGE) from exc
    except yaml.YAMLError as exc:
        raise CliError(f"{path} is not valid YAML: {exc}", ExitCode.USAGE) from exc
    if not isinstance(data, dict):
        raise CliError(f"{path}: expected a mapping with 'templates' and 'pools'", ExitCode.USAGE)
    unknown = sorted(set(data) - {"templates", "pools"})
    if unknown:
        raise CliError(f"{path}: unknown section '{unknown[0]}' (known: templates, pools)", ExitCode.USAGE)
    return FleetFile(
        templates=_entries(data, "templates", TEMPLATE_FIELDS, str(path)),
        pools=_entries(data, "pools", POOL_FIELDS, str(path)),
    )


def _budget(budget: Any) -> Any:
    """A budget as the API answers it and as a file may write it, in one form: no null fields, a
    count as a number (`max: "2"` is 2)."""
    if not isinstance(budget, dict):
        return budget
    plain = {k: v for k, v in budget.items() if v is not None}
    if isinstance(plain.get("max"), str) and plain["max"].strip().isdigit():
        plain["max"] = int(plain["max"])
    return plain


def _comparable(field: str, value: Any) -> Any:
    """What a field is compared as: a pool's disruption budgets in one form (see _budget)."""
    if field == "auto_rollout":
        return bool(value)  # a server that predates the field answers without it: false
    if field == "disruption" and isinstance(value, dict) and isinstance(value.get("budgets"), list):
        return {**value, "budgets": [_budget(b) for b in value["budgets"]]}
    return value


def _diff(kind: Kind, name: str, desired: dict[str, Any], current: dict[str, Any] | None) -> Change:
    if current is None:
        return Change(kind, name, "create", {k: (None, v) for k, v in desired.items()}, desired)
    changed = {
        k: (current.get(k), v)
        for k, v in desired.items()
        if _comparable(k, current.get(k)) != _comparable(k, v)
    }
    if not changed:
        return Change(kind, name, "unchanged")
    # A template PUT replaces the whole spec; a pool PUT changes only the fields it carries.
    body = {**{k: current.get(k) for k in TEMPLATE_FIELDS}, **desired} if kind == "template" else desired
    return Change(kind, name, "update", changed, body)


def plan(client: ApiClient, fleet: FleetFile) -> list[Change]:
    templates = {t["name"]: t for t in client.get("/api/v1/templates").get("items", [])}
    pools = {p["name"]: p for p in client.get("/api/v1/pools").get("items", [])}
    changes = [
        _diff("template", name, {**TEMPLATE_DEFAULTS, **spec}, templates.get(name))
        for name, spec in fleet.templates.items()
    ]
    changes += [_diff("pool", name, spec, pools.get(name)) for name, spec in fleet.pools.items()]
    return changes


def apply(client: ApiClient, changes: list[Change]) -> None:
    # Templates first: a pool names no template, but workers created right after may name both.
    for change in changes:
        if change.action == "unchanged":
            continue
        resource = "templates" if change.kind == "template" else "pools"
        client.put(f"/api/v1/{resource}/{change.name}", change.body)
