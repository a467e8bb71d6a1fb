"""A record's environment: what must match for two records to be compared, and the code
that ran (the commit, and the tree of the files where they were not the commit's)."""

from __future__ import annotations

import json
import typing

from reports.record.decode import record_section

_section = record_section


@_section
class Environment:
    """What must match for two records to be compared (and where they ran)."""

    git_sha: str | None
    """HEAD of the checkout the code ran from."""
    git_dirty: bool | None
    """The files that ran were not HEAD's (`git_tree` is not HEAD's tree)."""
    versions: dict[str, str | None]
    python: str
    backend: str
    device_kind: str
    device_count: int
    local_device_count: int
    process_count: int
    xla_flags: str
    host: str
    git_tree: str | None = None
    """The git tree id of the files that ran (tracked and untracked-not-ignored, as on
    disk): names the code exactly, committed or not (harness.system.git.files_tree)."""
    host_malloc: str = ""
    """Allocator settings the cell ran under (`MALLOC_*=...`, a preloaded malloc); on CPU
    they decide whether each execution's temp buffer faults in fresh pages
    (harness.system.allocator)."""

    COMPARABLE: typing.ClassVar[tuple[str, ...]] = (
        "versions", "backend", "device_kind", "device_count", "process_count", "xla_flags",
        "host_malloc")
    """What two records must share to be compared (the code, `git_*`, is what an A/B
    varies; python and host are informational)."""

    PLAN_COMPARABLE: typing.ClassVar[tuple[str, ...]] = tuple(
        k for k in COMPARABLE if k != "host_malloc")
    """What two plans must share: a plan is the compiler's output for the target, the same
    to the byte whichever allocator the host compiled it with (harness.system.allocator)."""

    def code(self, width: int = 10) -> str:
        """The code that ran, in words: its commit ('0123456789'); for files that are not
        their commit's, the commit they change and the tree that names them ('0123456789 +
        changes, tree abcdef0123'); '?' where no git checkout was read."""
        if not self.git_sha:
            return "?"
        if not self.git_dirty:
            return self.git_sha[:width]
        tree = f", tree {self.git_tree[:width]}" if self.git_tree else ""
        return f"{self.git_sha[:width]} + changes{tree}"

    def comparable_key(self, plan: bool = False, versions: bool = True) -> tuple:
        """The COMPARABLE (for a `plan`, PLAN_COMPARABLE) values as canonical JSON; without
        the package `versions` for the A/B of two software stacks (what it compares)."""
        names = self.PLAN_COMPARABLE if plan else self.COMPARABLE
        return tuple(json.dumps(getattr(self, k), sort_keys=True) for k in names
                     if versions or k != "versions")
