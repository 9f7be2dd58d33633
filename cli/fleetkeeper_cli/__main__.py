"""`python -m fleetkeeper_cli`, the same as the `fleetkeeper` console script."""

from fleetkeeper_cli.app import main

if __name__ == "__main__":
    main()
