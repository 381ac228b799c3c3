"""Every file the documents name exists, so a moved module cannot leave the docs pointing at nothing.

The docs (README.md, ARCHITECTURE.md, docs/) name files in backquotes, as `core/repair.py`,
`tests/fake_llm.py` or `tools/sandbox/` (relative to the repository or to the package), and the
module map lists them at the start of its lines. The site's own links and anchors are checked by
`mkdocs build --strict` (.ci/run).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "a3s_agent"
DOCUMENTS = [REPO / "README.md", REPO / "ARCHITECTURE.md", *sorted((REPO / "docs").rglob("*.md"))]
# A path in backquotes: a file with an extension under a directory, or two directories or more.
PATH = re.compile(
    r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|proto|md|yaml|yml|toml|txt|mjs|cjs|json)|(?:[\w.-]+/){2,})`"
)
# A line of the module map (a code block) that starts with a path of the repository.
LISTED = re.compile(r"^((?:a3s_agent|tests|tools|protos|deploy)/[^\s,]*)", re.M)
# Named in the docs but not files of this repository: the data directory's, the workspace's, a
# checkout of another project's, a container's.
ELSEWHERE = re.compile(
    r"^(\.a3s/|\.venv/|~|/|\./|ts/__tests__/|examples/|sdk/|homes/|spaces/<|<|\.\./|inbox/)"
)


def _named(text: str) -> set[str]:
    quoted = {m.group(1) for m in PATH.finditer(text)}
    listed = {m.group(1) for m in LISTED.finditer(text)}
    return {path for path in quoted | listed if not ELSEWHERE.match(path)}


def _exists(path: str) -> bool:
    return any((root / path).exists() for root in (REPO, PACKAGE, REPO / "docs"))


def test_every_path_the_docs_name_exists() -> None:
    missing = {
        f"{doc.relative_to(REPO)}: {path}"
        for doc in DOCUMENTS
        for path in _named(doc.read_text())
        if not _exists(path)
    }
    assert not missing, "the docs name files that do not exist:\n" + "\n".join(sorted(missing))


def _map_entries(text: str) -> Iterator[tuple[str, str]]:
    """(the entry's path, a module its description names) for each `x.py` of the module map."""
    block = text[text.index("```\n") + 4 : text.rindex("```")]
    entry = ""
    for line in block.splitlines():
        first = re.match(r"(\S+)", line)
        if first:
            entry = first.group(1).rstrip(",")
        for name in re.findall(r"[\w/]+\.py\b", line[first.end() :] if first else line):
            yield entry, name


def test_every_module_the_module_map_names_exists() -> None:
    """The map's descriptions name modules by their file name (`convert.py`), inside the entry's
    directory or a subdirectory of it, or from the package or the repository (`tools/safe_git.py`)."""
    modules = REPO / "docs" / "contributing" / "modules.md"
    missing = set()
    for entry, name in _map_entries(modules.read_text()):
        home = REPO / entry if entry.endswith("/") else (REPO / entry).parent
        if not any((root / name).exists() for root in (home, PACKAGE, REPO)) and not any(
            home.rglob(Path(name).name)
        ):
            missing.add(f"{entry}: {name}")
    assert not missing, "the module map names modules that do not exist:\n" + "\n".join(sorted(missing))
