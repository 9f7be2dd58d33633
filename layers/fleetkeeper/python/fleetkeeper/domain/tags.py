"""EC2 tags: the ones by which fleetkeeper recognises its machines, and EC2's rules for any tag."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Mapping
from typing import Annotated, Any, Final

from pydantic import AfterValidator, Field

MANAGED_BY_TAG: Final = "fleetkeeper:managed-by"
MANAGED_BY_VALUE: Final = "fleetkeeper"
WORKER_ID_TAG: Final = "fleetkeeper:worker-id"
TEMPLATE_TAG: Final = "fleetkeeper:template"
POOL_TAG: Final = "fleetkeeper:pool"
# The launch batch a machine came from (its RunInstances' ClientToken); with the machine's AmiLaunchIndex
# it names the worker that claimed it, before the worker-id tag is written (docs/capacity.md).
BATCH_TAG: Final = "fleetkeeper:launch-batch"

# EC2's tag rules (Amazon EC2 User Guide, "Tag restrictions"): letters, digits and spaces of any script
# and + - = . _ : / @; a key of 1 to 128 characters that does not start with aws:, a value of up to 256,
# at most 50 tags a resource. A tag outside them is refused by RunInstances on AWS; the local stack's EC2
# took a NUL once and then answered every DescribeInstances with XML no client could read.
MAX_EC2_TAGS: Final = 50
MAX_TAG_KEY: Final = 128
MAX_TAG_VALUE: Final = 256
_SIGNS: Final = frozenset("+-=._:/@")
# The same characters as a JSON Schema (ECMA-262, Unicode) pattern: EC2's own.
TAG_TEXT_PATTERN: Final = r"^[\p{L}\p{Z}\p{N}_.:/=+\-@]*$"
_RULE: Final = "letters, digits, spaces and + - = . _ : / @"
TAGS_SCHEMA: Final[dict[str, Any]] = {
    "maxProperties": MAX_EC2_TAGS,
    "propertyNames": {
        "minLength": 1,
        "maxLength": MAX_TAG_KEY,
        "pattern": TAG_TEXT_PATTERN,
        "not": {"pattern": "^[aA][wW][sS]:"},
    },
    "additionalProperties": {"type": "string", "maxLength": MAX_TAG_VALUE, "pattern": TAG_TEXT_PATTERN},
}


def _allowed(char: str) -> bool:
    # Unicode categories L* (letters), N* (digits and numbers), Z* (spaces): \p{L}, \p{N}, \p{Z}.
    return char in _SIGNS or unicodedata.category(char)[0] in "LNZ"


def _foreign(text: str) -> str | None:
    char = next((c for c in text if not _allowed(c)), None)
    return None if char is None else f"U+{ord(char):04X} ({unicodedata.name(char, 'unnamed')})"


def tag_problem(tags: Mapping[str, str]) -> str | None:
    """Why EC2 would refuse these tags, naming the first tag at fault; None when it would take them."""
    if len(tags) > MAX_EC2_TAGS:
        return f"at most {MAX_EC2_TAGS} tags, not {len(tags)}"
    for key, value in tags.items():
        name = json.dumps(key[:MAX_TAG_KEY])
        if not 1 <= len(key) <= MAX_TAG_KEY:
            return f"a tag key has 1 to {MAX_TAG_KEY} characters, not {len(key)}"
        if key.lower().startswith("aws:"):
            return f"tag key {name} uses the prefix aws:, which AWS keeps for itself"
        if len(value) > MAX_TAG_VALUE:
            return f"tag {name} has a value of {len(value)} characters; at most {MAX_TAG_VALUE}"
        for part, text in (("key", key), ("value", value)):
            found = _foreign(text)
            if found is not None:
                return f"tag {name}: its {part} holds {found}; EC2 allows {_RULE}"
    return None


def _ec2_tags(tags: dict[str, str]) -> dict[str, str]:
    problem = tag_problem(tags)
    if problem is not None:
        raise ValueError(problem)
    return tags


# Tags as a request gives them: EC2's rules checked, and the same rules published in the schema.
Ec2Tags = Annotated[dict[str, str], AfterValidator(_ec2_tags), Field(json_schema_extra=TAGS_SCHEMA)]
