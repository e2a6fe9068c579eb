"""Clients of both services: `fedprompt simulate`, experiment grids and the `fedprompt` operator CLI.

Above coordinator/ and worker/ (which never import each other; both stand on shared/): sim starts
them as processes and may import either.
"""
