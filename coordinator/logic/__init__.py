"""Pure logic of the coordinator: aggregation rules and client selection (no I/O)."""

from fedprompt.coordinator.logic import aggregation, robust  # noqa: F401  (robust registers its rules)
