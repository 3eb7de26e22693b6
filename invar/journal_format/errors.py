"""What reading a journal can refuse: each message is one line that names the file (and line)."""

from __future__ import annotations


class JournalError(ValueError):
    """A journal that cannot be read: names the file and line."""


class ChainError(JournalError):
    """A line whose chain link does not match its text and the lines before it (an edit, a
    rewrite without the key, a key other than the journal's), or a key that does not fit the
    journal: names the line."""


class PayloadError(JournalError):
    """A payload a line refers to that is missing from its segment file, or does not match its
    digest (the file changed after it was written): names the file and the line."""


class SnapshotError(JournalError):
    """A snapshot that does not hold the state the journal recorded at its line, or cannot be
    read as one: names the file."""
