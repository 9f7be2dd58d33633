"""fleetkeeper: a serverless control plane for fleets of EC2 worker machines."""

# Registers the after-restore hook that re-seeds randomness in SnapStart environments; the runtime runs
# only hooks the handler's imports registered, and every handler imports this package.
from fleetkeeper import uniqueness as _uniqueness  # noqa: F401

__version__ = "0.1.0"
