"""Local-only tooling: the emulated AWS stack, demo data and the local control plane. Not shipped."""
