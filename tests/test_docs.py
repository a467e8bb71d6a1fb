"""The README and docs/ as a front door that stays open: every relative link in README.md and
docs/*.md resolves to a file of the repository (and a `#anchor` to a heading of that file, by
GitHub's slug rules), every docs page has a title and is linked from the README, every
`code-quoted` repository path (`harness/cell/run.py`) names something that exists, and the
README stays at most 200 lines. Links and headings inside code (fenced blocks, `spans`) are
not links or headings, so they are left out."""

import re
import shutil
from pathlib import Path
from urllib.parse import unquote

REPO = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,}).*?^ {0,3}\1[`~]*[ \t]*$", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]"  # [text], one level of [] inside
                          r"\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")  # (target "title")
_REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$", re.MULTILINE)
_HTML_ANCHOR = re.compile(r"""<a\s+(?:name|id)=["']([^"']+)["']""")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
_REPO_PATH = re.compile(r"`((?:engine|arms|harness|reports|tests|notebooks)/[\w/.*\-]*)`")


def doc_files(root: Path = REPO) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def _prose(text: str) -> str:
    """The markdown without its code: fenced blocks and code spans blanked out."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup removed, lowercase, punctuation other than '-'
    and '_' dropped, each space a '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
    text = re.sub(r"<[^>]+>", "", text).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a file's headings give (a repeated slug gets -1, -2, ... as on GitHub),
    and any explicit `<a name=...>`/`<a id=...>`."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    prose = _FENCE.sub("", path.read_text())
    for match in _HEADING.finditer(prose):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found | set(_HTML_ANCHOR.findall(prose))


def links(path: Path) -> list[str]:
    """The targets of a markdown file's inline and reference links (images included)."""
    prose = _prose(path.read_text())
    return [*_INLINE_LINK.findall(prose), *_REFERENCE_LINK.findall(prose)]


def broken_links(files: list[Path], root: Path = REPO) -> list[str]:
    """'file: target (why)' for each relative link that does not resolve under `root`."""
    broken = []
    for path in files:
        for target in links(path):
            if not target or _SCHEME.match(target) or target.startswith("//"):
                continue  # a web address, mailto:, ...: not checked here
            file_part, _, anchor = target.partition("#")
            where = path if not file_part else (path.parent / unquote(file_part)).resolve()
            name = f"{path.relative_to(root)}: {target}"
            if root.resolve() not in (where, *where.parents):
                broken.append(f"{name} (outside the repository)")
            elif not where.exists():
                broken.append(f"{name} (no such file)")
            elif anchor and where.is_dir():
                broken.append(f"{name} (an anchor into a directory)")
            elif anchor and where.suffix == ".md" and unquote(anchor) not in anchors(where):
                broken.append(f"{name} (no heading with anchor #{anchor})")
    return broken


def test_every_relative_link_resolves():
    assert broken_links(doc_files()) == []


def readme_too_long(root: Path = REPO) -> str | None:
    """Why the README is too long to be a front door, or None."""
    lines = len((root / "README.md").read_text().splitlines())
    if lines > README_MAX_LINES:
        return f"README.md has {lines} lines (at most {README_MAX_LINES}); move detail into docs/"
    return None


def test_readme_is_at_most_200_lines():
    assert readme_too_long() is None


def test_every_docs_page_has_a_title_and_is_linked_from_the_readme():
    pages = sorted((REPO / "docs").glob("*.md"))
    assert pages, "docs/ holds no pages"
    readme_targets = {(REPO / t.partition("#")[0]).resolve() for t in links(REPO / "README.md")}
    for page in pages:
        first = page.read_text().splitlines()[0]
        assert first.startswith("# "), f"{page.name} does not open with a '# ' title"
        assert page.resolve() in readme_targets, f"README.md does not link docs/{page.name}"


def test_slug_follows_githubs_rules():
    assert slug("Lockstep A/B: the default of `parity ab`") == \
        "lockstep-ab-the-default-of-parity-ab"
    assert slug("In-process pairing (`parity run --pairing in-process`)") == \
        "in-process-pairing-parity-run---pairing-in-process"
    assert slug("What a report's summary says") == "what-a-reports-summary-says"
    assert slug("snake_case and CAPS") == "snake_case-and-caps"


def test_a_broken_link_or_anchor_is_caught(tmp_path):
    """The check can fail: in a copy of the docs, a link to a missing file, a link to a
    missing heading and a link out of the repository are each reported, while the copy's
    good links still pass and links inside code are not read."""
    for path in doc_files():
        copy = tmp_path / path.relative_to(REPO)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, copy)
    # Files outside README/docs that the docs link to (e.g. tests/data/traces/README.md).
    for path in doc_files():
        for target in links(path):
            file_part = target.partition("#")[0]
            if not file_part or _SCHEME.match(file_part):
                continue
            source = (path.parent / file_part).resolve()
            if not source.is_file() or REPO not in source.parents:
                continue
            copy = tmp_path / source.relative_to(REPO)
            if not copy.exists():
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(source, copy)
    copies = doc_files(tmp_path)
    assert broken_links(copies, tmp_path) == []

    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text() + "\n[gone](docs/no-such-page.md)\n"
                      "[lost](docs/numbers.md#no-such-heading)\n"
                      "[out](../../outside.md)\n"
                      "`[in code](docs/also-gone.md)`\n"
                      "```\n[in a fence](docs/fenced-gone.md)\n```\n")
    page = tmp_path / "docs" / "numbers.md"
    page.write_text(page.read_text() + "\n[self](#nor-this-one)\n")
    found = broken_links(copies, tmp_path)
    assert found == [
        "README.md: docs/no-such-page.md (no such file)",
        "README.md: docs/numbers.md#no-such-heading (no heading with anchor #no-such-heading)",
        "README.md: ../../outside.md (outside the repository)",
        "docs/numbers.md: #nor-this-one (no heading with anchor #nor-this-one)",
    ]


def test_a_long_readme_is_caught(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("line\n" * README_MAX_LINES)
    assert readme_too_long(tmp_path) is None
    readme.write_text("line\n" * (README_MAX_LINES + 1))
    assert readme_too_long(tmp_path) == (
        f"README.md has {README_MAX_LINES + 1} lines (at most {README_MAX_LINES}); "
        "move detail into docs/")


def stale_paths(files: list[Path], root: Path = REPO) -> list[str]:
    """'file: path' for each `code-quoted` repository path in the prose that names nothing
    (a glob such as `harness/grid/suites/*.toml` must match something)."""
    stale = []
    for path in files:
        for named in _REPO_PATH.findall(_FENCE.sub("", path.read_text())):
            if not (any(root.glob(named)) if "*" in named else (root / named).exists()):
                stale.append(f"{path.relative_to(root)}: {named}")
    return stale


def test_every_quoted_repository_path_exists(tmp_path):
    assert stale_paths(doc_files()) == []
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "here.py").write_text("")
    page = tmp_path / "README.md"
    page.write_text("`harness/here.py`, `harness/gone.py`, `harness/*.py`, `harness/*.toml`\n")
    assert stale_paths([page], tmp_path) == ["README.md: harness/gone.py",
                                             "README.md: harness/*.toml"]
