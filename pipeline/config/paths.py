"""Where the package's configuration and sample data are, and the resolvers that name them in
``conf/`` (``${package_data:}``)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

# The configuration and the sample data ship inside the package (package data), so a wheel finds
# them wherever it is installed; a checkout's top-level conf/ and data/ are links to these.
PACKAGE_DIR = Path(__file__).resolve().parents[1]
CONF_DIR = PACKAGE_DIR / "conf"
DATA_DIR = PACKAGE_DIR / "data"
if not OmegaConf.has_resolver("package_data"):
    # ${package_data:} in conf/ is the installed package's data/, so bundled inputs are found
    # from any directory, in a checkout and from a wheel alike.
    OmegaConf.register_new_resolver("package_data", lambda: str(DATA_DIR))
if not OmegaConf.has_resolver("repo_root"):
    # Kept for configs written before the data moved into the package: ${repo_root:}/data/...
    # still names the bundled data (the package directory holds data/ and conf/ as the
    # checkout's root did).
    OmegaConf.register_new_resolver("repo_root", lambda: str(PACKAGE_DIR))
