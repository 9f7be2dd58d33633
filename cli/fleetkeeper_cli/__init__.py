"""`fleetkeeper`: the operator's command line for the admin API (local or deployed)."""
