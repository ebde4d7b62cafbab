"""What moved, recorded: the ledger of every message (inside a node or between nodes), the tags
that name a call, the timeline of every rank. See ../__init__.py."""
