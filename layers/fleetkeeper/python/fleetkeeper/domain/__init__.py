"""Pure rules of fleetkeeper: lifecycles, models, drain and placement policies. No AWS imports."""
