"""fleetkeeper: a serverless control plane for fleets of EC2 worker machines."""

__version__ = "0.1.0"
