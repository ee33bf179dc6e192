"""The catalog: the SQLite database that names everything the log holds.

Owns the connection and its transactions (db: one writer thread, group commit, per-thread
readers), the schema, the tree as of any generation and changes to the live one
(namespace, xattrs), file history and expiry (history), snapshots, the format upgrade
(upgrade), and the change events published after each durable change (events).

May import: log.
"""
