"""Where the coordinator keeps its state: the tables (db.py), the schema's migrations (migrate.py), the
store the use cases read and write through (store.py), and the two ways uploads share SQLite's one
writer (writelock.py, groupcommit.py)."""
