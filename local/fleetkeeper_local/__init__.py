"""Local-only tooling: the emulated AWS stack, demo data and the local control plane. Not shipped."""

import os
from pathlib import Path

# moto's EC2 starts every region with thousands of stock Amazon AMIs, loaded again on every reset and
# scanned by every RunInstances and DescribeImages: seconds of CPU a test. fleetkeeper launches only
# the images its templates name (registered by the local stack), so two stock images are enough. It is
# moto's own setting, read when moto's EC2 is first imported; one set by the caller wins.
os.environ.setdefault("MOTO_AMIS_PATH", str(Path(__file__).with_name("stock_images.json")))
