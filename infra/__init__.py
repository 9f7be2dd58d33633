"""The fleetkeeper CDK app: one stack per stage, one construct per concern."""
