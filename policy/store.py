"""The active ruleset document: loaded from a file or from the API, swapped atomically.

Readers take :attr:`RulesetStore.document` once per request (a single reference
read), so a swap never mixes two rulesets inside one check, and a stream keeps
the ruleset it started with. An invalid candidate raises ``RulesetError`` before
anything is swapped, so the old ruleset stays active.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from policy.rules import RulesetDocument, parse_ruleset

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FileStamp:
    """What the watcher compares: a change of any of these means the file was replaced or edited."""

    mtime_ns: int
    size: int
    inode: int


def stamp(path: Path) -> FileStamp | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return FileStamp(st.st_mtime_ns, st.st_size, st.st_ino)


class RulesetStore:
    """Holds the active document and knows the file it came from."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.applied_stamp = stamp(path)
        self.document: RulesetDocument = parse_ruleset(path.read_bytes(), str(path))
        # The stamp of a file that failed to parse, so it is reported once, not every tick.
        self.rejected_stamp: FileStamp | None = None

    def read_file(self) -> tuple[RulesetDocument, FileStamp | None]:
        """Parses the file as it is now (RulesetError if invalid); swaps nothing."""
        current = stamp(self.path)
        return parse_ruleset(self.path.read_bytes(), str(self.path)), current

    @staticmethod
    def parse_api(text: str) -> RulesetDocument:
        return parse_ruleset(text, "api")

    def file_changed(self) -> FileStamp | None:
        """The new stamp if the file changed since it was last applied (or rejected), else None."""
        current = stamp(self.path)
        if current is None or current in (self.applied_stamp, self.rejected_stamp):
            return None
        return current

    def swap(self, document: RulesetDocument, file_stamp: FileStamp | None = None) -> RulesetDocument:
        """Makes ``document`` active; returns the one it replaced."""
        old = self.document
        self.document = document
        if file_stamp is not None:
            self.applied_stamp = file_stamp
            self.rejected_stamp = None
        log.info(
            "ruleset %s active (%d rules, from %s)", document.version, len(document.rules), document.source
        )
        return old

    def restore(self, document: RulesetDocument, file_stamp: FileStamp | None) -> None:
        """Undoes a swap whose version bump failed (the stamp too, so the watcher retries)."""
        self.document = document
        if file_stamp is not None:
            self.applied_stamp = file_stamp
