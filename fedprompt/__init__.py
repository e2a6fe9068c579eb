"""fedprompt: federated prompt tuning as deployable services.

The one top-level import of the distribution. Its parts live in the repository's top-level folders
and install as subpackages: `fedprompt.coordinator`, `fedprompt.worker`, `fedprompt.shared`,
`fedprompt.sim` and `fedprompt.migrations` (see `[tool.setuptools]` in pyproject.toml).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("fedprompt")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
