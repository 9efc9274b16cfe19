"""Every relative Markdown link in README.md and docs/ points at a file or directory of the
repository, and every ``#anchor`` into a Markdown file names one of its headings (GitHub's slugs).
Links only: paths in code spans and code blocks are not checked."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]"  # [text] or ![alt], one level of brackets inside
    r"\(\s*<?([^()\s<>]*(?:\([^()\s]*\)[^()\s<>]*)*)>?"  # (target, balanced parentheses allowed
    r"(?:\s+\"[^\"]*\")?\s*\)"  # an optional "title")
)
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$", re.M)
EXTERNAL = ("http://", "https://", "mailto:")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def prose(text: str) -> str:
    """The text without its fenced code blocks and inline code spans (links there are code)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lowercased, characters other than letters, digits,
    spaces, hyphens and underscores dropped, each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings; a repeated slug gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path.read_text())) if t and not t.startswith(EXTERNAL)]


def broken(path: Path) -> list[str]:
    """The links of ``path`` that do not resolve, each with the reason."""
    found = []
    for target in links(path):
        file, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file)).resolve() if file else path
        if not dest.exists():
            found.append(f"{target}: no {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif not dest.is_relative_to(ROOT):
            found.append(f"{target}: outside the repository")
        elif anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
            found.append(f"{target}: no heading with that anchor in {dest.relative_to(ROOT)}")
    return found


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert not (problems := broken(page)), "\n".join(problems)


def test_the_slug_rule_is_githubs():
    assert slug("Predicted for a TPU slice (`time --predict`)") == "predicted-for-a-tpu-slice-time---predict"
    assert slug("An 8-bit KV cache (`cache_dtype`)") == "an-8-bit-kv-cache-cache_dtype"
    assert slug("Memory plan for TPU / GPU (`plan`)") == "memory-plan-for-tpu--gpu-plan"
    assert slug("The paper's claims") == "the-papers-claims"


def test_the_checker_finds_a_broken_link_and_a_missing_anchor(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "b.md").write_text("# Title\n\n## Same\n\n## Same\n")
    page = tmp_path / "a.md"
    page.write_text(
        "[ok](b.md#same-1) [ok](#here) [gone](c.md) [bad](b.md#same-2) [web](https://x.org/y)\n"
        "`[code](nowhere.md)`\n\n```\n[block](nowhere.md)\n```\n\n## Here\n"
    )
    assert [p.split(":")[0] for p in broken(page)] == ["c.md", "b.md#same-2"]
