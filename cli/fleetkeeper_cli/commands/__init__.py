"""One module per command group; `fleetkeeper_cli.app` registers each command under its name."""
