"""The coordinator's use cases, one module each, all over coordinator/persistence/store.py; coordinator/service.py
composes them into the `Coordinator` the routes call."""
