"""The maps of the house cannot drift: docs/architecture.md names every module where it is, and the README's layout
is the package's folder tree."""

from __future__ import annotations

import re

from tests.conftest import REPO

PACKAGE = REPO / "specscope"


def _block(text: str, heading: str) -> str:
    """The first fenced block after ``heading``."""
    return text[text.index(heading):].split("```")[1]


def mapped_modules(block: str) -> set[str]:
    """The module paths a tree block names: ``name.py`` entries under their folders, and the ``x.py`` a folder's
    description lists."""
    found: set[str] = set()
    folders: list[tuple[int, str]] = []
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        entry, _, note = line.strip().partition(" ")
        folders = [(i, f) for i, f in folders if i < indent]
        where = "".join(f for _, f in folders)
        if entry.endswith("/"):
            folders.append((indent, entry))
            found |= {where + entry + m for m in re.findall(r"\b(\w+\.py)\b", note)}
        elif entry.endswith(".py"):
            found.add(where + entry)
    return found


def package_modules() -> set[str]:
    """Every module file of the package, as ``specscope/...`` paths; a subpackage's ``__init__.py`` is its folder."""
    return {str(p.relative_to(REPO)) for p in PACKAGE.rglob("*.py")
            if p.name != "__init__.py" or p.parent == PACKAGE}


def test_the_architecture_page_names_every_module_where_it_is() -> None:
    mapped = mapped_modules(_block((REPO / "docs" / "architecture.md").read_text(), "## Every room"))
    assert mapped == package_modules()


def test_the_readme_layout_is_the_package_folder_tree() -> None:
    block = _block((REPO / "README.md").read_text(), "## Layout")
    named = set(re.findall(r"^  (\w+/)", block, re.M))
    assert named == {p.name + "/" for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def test_the_map_reader_sees_a_missing_and_a_misplaced_module() -> None:
    block = "specscope/\n  cli.py   x\n  core/   the core\n    model.py  y\n  read/   r: scrape.py, fleet.py\n"
    assert mapped_modules(block) == {"specscope/cli.py", "specscope/core/model.py", "specscope/read/scrape.py",
                                     "specscope/read/fleet.py"}


#: A room past this many lines says why at the top of its docstring.
MAX_LINES = 400


def test_a_room_over_400_lines_says_why_at_its_top() -> None:
    import ast

    silent = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if text.count("\n") > MAX_LINES:
            doc = ast.get_docstring(ast.parse(text)) or ""
            if f"{MAX_LINES} lines" not in doc[:800]:
                silent.append(f"{path.relative_to(REPO)}: {text.count(chr(10))} lines")
    assert silent == []
