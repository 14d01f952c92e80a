"""The README and docs/ point only at things that exist, and the README stays a short first read.

Checked in README.md and docs/*.md, outside fenced code blocks:
- every relative markdown link `[text](path)` or `[text](path#anchor)` names a file or folder of the repository
  (http, https and mailto links are not followed), and its anchor a heading of the file it names;
- every word in backticks that looks like a repository path (it contains a `/` and ends in a known extension, or
  starts with a top-level folder of the repository) names one. Paths that .gitignore covers (`var/`, `.venv`,
  bench/results) are made at run time and are not looked for.
And docs/performance.md holds current figures only (at most 400 lines), docs/figures at most 20 raw outputs, one per
benchmark and host kind, named without a date: history lives in git.
"""
from __future__ import annotations

import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 300
EXTENSIONS = (".py", ".md", ".html", ".json", ".jsonl", ".txt", ".toml", ".ini", ".cfg", ".sh", ".js", ".css",
              ".yml", ".yaml", ".log", ".csv")

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
PATH_WORD = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.\-/]*(#[A-Za-z0-9_\-]+)?$")


def markdown_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def prose(text: str) -> str:
    """The text without its fenced code blocks (line numbers kept, so that a failure can say where)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of each markdown link outside code."""
    text = prose(path.read_text(encoding="utf-8"))
    text = INLINE_CODE.sub(lambda m: " " * len(m.group(0)), text)
    return [(line_of(text, m.start()), m.group(1)) for m in LINK.finditer(text)]


def relative_links(path: Path) -> list[tuple[int, str]]:
    return [(line, target) for line, target in links(path)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) and not target.startswith("#")]


def ignored_by_git(relative: str) -> bool:
    """Whether a path falls under a pattern of the repository's .gitignore (files made at run time)."""
    patterns = [line.strip() for line in (ROOT / ".gitignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    parts = relative.strip("/").split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for pattern in patterns:
        bare = pattern.strip("/")
        for prefix in prefixes:
            name = prefix.rsplit("/", 1)[-1]
            if fnmatch.fnmatch(prefix, bare) or ("/" not in bare and fnmatch.fnmatch(name, bare)):
                return True
    return False


def top_level_folders() -> set[str]:
    return {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}


def looks_like_repository_path(word: str) -> bool:
    if "/" not in word or word.startswith(("/", "./", "../")) or "//" in word:
        return False
    bare = word.split("#", 1)[0]
    return bare.endswith(EXTENSIONS) or bare.split("/", 1)[0] in top_level_folders()


def backticked_paths(path: Path) -> list[tuple[int, str]]:
    """(line, path) of each path-like word inside inline code, outside fenced blocks."""
    text = prose(path.read_text(encoding="utf-8"))
    found = []
    for match in INLINE_CODE.finditer(text):
        for word in match.group(2).split():
            word = word.strip(",;:()")
            if PATH_WORD.match(word) and looks_like_repository_path(word):
                found.append((line_of(text, match.start()), word.split("#", 1)[0]))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = prose(path.read_text(encoding="utf-8"))
    found, seen = set(), {}
    for match in HEADING.finditer(text):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        found.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return found


def missing_link_targets(path: Path) -> list[str]:
    missing = []
    for line, target in relative_links(path):
        file_part = target.split("#", 1)[0]
        if file_part and not (path.parent / file_part).exists():
            missing.append(f"{path.relative_to(ROOT)}:{line}: {target}")
    return missing


def test_every_link_in_the_readme_and_docs_points_at_a_file_that_exists():
    missing = [problem for path in markdown_files() for problem in missing_link_targets(path)]
    assert not missing, "links to files that do not exist:\n" + "\n".join(missing)


def test_every_link_anchor_names_a_heading_of_the_file_it_points_at():
    missing = []
    for path in markdown_files():
        for line, target in links(path):
            if "#" not in target or re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                continue
            file_part, anchor = target.split("#", 1)
            linked = (path.parent / file_part) if file_part else path
            if linked.suffix == ".md" and linked.exists() and anchor not in anchors(linked):
                missing.append(f"{path.relative_to(ROOT)}:{line}: {target}")
    assert not missing, "anchors that name no heading:\n" + "\n".join(missing)


def test_every_repository_path_in_backticks_exists():
    missing = []
    for path in markdown_files():
        for line, word in backticked_paths(path):
            if not ignored_by_git(word) and not (ROOT / word).exists():
                missing.append(f"{path.relative_to(ROOT)}:{line}: {word}")
    assert not missing, "paths in backticks that are not in the repository:\n" + "\n".join(missing)


def test_the_readme_is_at_most_300_lines():
    num_lines = len(README.read_text(encoding="utf-8").splitlines())
    assert num_lines <= MAX_README_LINES, f"README.md has {num_lines} lines (at most {MAX_README_LINES})"


def test_the_readme_shows_make_run_and_make_test_before_any_other_command():
    text = README.read_text(encoding="utf-8")
    first_fence = FENCE.search(text)
    assert first_fence is not None, "README.md has no code block"
    before = text[:first_fence.start()]
    assert not INLINE_CODE.search(before), f"code before the first block: {INLINE_CODE.search(before).group(0)}"
    commands = [line.split("#", 1)[0].strip() for line in first_fence.group(0).splitlines()[1:-1]]
    commands = [command for command in commands if command]
    assert commands[:2] == ["make run", "make test"], f"the first commands are {commands[:2]}"


MAX_PERFORMANCE_LINES = 400
MAX_FIGURES = 20
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def test_performance_md_holds_current_figures_only():
    """docs/performance.md keeps one current result per benchmark and host kind; history lives in git."""
    num_lines = len((ROOT / "docs" / "performance.md").read_text(encoding="utf-8").splitlines())
    assert num_lines <= MAX_PERFORMANCE_LINES, f"docs/performance.md has {num_lines} lines (at most {MAX_PERFORMANCE_LINES})"


def test_figures_are_one_file_per_benchmark_and_host_kind_without_dates():
    """docs/figures holds at most 20 files, named `<benchmark>-<host kind>.json`: no date in a name."""
    names = sorted(p.name for p in (ROOT / "docs" / "figures").iterdir() if not p.name.startswith("."))
    assert len(names) <= MAX_FIGURES, f"docs/figures holds {len(names)} files (at most {MAX_FIGURES}): {names}"
    dated = [name for name in names if DATE.search(name)]
    assert not dated, f"figure files named with a date (history lives in git): {dated}"
