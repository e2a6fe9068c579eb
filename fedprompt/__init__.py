"""fedprompt: federated prompt tuning as deployable services.

The one top-level import of the distribution. Its parts live in the repository's top-level folders
and install as subpackages: `fedprompt.coordinator`, `fedprompt.worker`, `fedprompt.shared`,
`fedprompt.sim` and `fedprompt.migrations` (`[tool.setuptools]` in pyproject.toml maps them).
"""

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

try:
    __version__ = version("fedprompt")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

# A source tree on PYTHONPATH (no install): the subpackages are the folders beside this one.
_SOURCE_ROOT = Path(__file__).resolve().parent.parent
if (_SOURCE_ROOT / "pyproject.toml").is_file() and (_SOURCE_ROOT / "coordinator" / "__init__.py").is_file():
    __path__.append(str(_SOURCE_ROOT))
