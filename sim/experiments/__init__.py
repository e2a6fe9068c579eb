"""Experiment grids over `fedprompt simulate`: configs, a resumable runner, tables and plots."""
