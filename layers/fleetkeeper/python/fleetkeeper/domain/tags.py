"""EC2 tags by which fleetkeeper recognises its machines."""

from typing import Final

MANAGED_BY_TAG: Final = "fleetkeeper:managed-by"
MANAGED_BY_VALUE: Final = "fleetkeeper"
WORKER_ID_TAG: Final = "fleetkeeper:worker-id"
TEMPLATE_TAG: Final = "fleetkeeper:template"
POOL_TAG: Final = "fleetkeeper:pool"
