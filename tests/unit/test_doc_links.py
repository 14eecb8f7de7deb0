"""Every relative link of the documentation leads somewhere: README.md, CONTRIBUTING.md and the
Markdown under docs/, deploy/ and bench/ link files that exist and #anchors that name a heading
of the page linked, by GitHub's rule for anchors (lowercase, spaces to '-', punctuation dropped,
a repeated heading's anchor suffixed -1, -2, ...). Links to other sites are not fetched.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A Markdown link or image: [text](target) or [text](target "title"); text may span lines.
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)


def doc_files() -> list[Path]:
    """The Markdown files whose links are checked."""
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
    for folder in ("docs", "deploy", "bench"):
        files += sorted((ROOT / folder).rglob("*.md"))
    return [f for f in files if f.is_file()]


def _prose(text: str) -> str:
    """`text` without fenced code blocks and code spans, where brackets are not links."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)  # code spans render as their text
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link renders as its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page has: one per heading (repeats numbered), and explicit HTML ones."""
    seen: dict[str, int] = {}
    found = set(_HTML_ANCHOR.findall(text))
    for _, heading in _HEADING.findall(_FENCE.sub("", text)):
        base = slug(heading)
        count = seen.get(base, 0)
        found.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return found


def broken_links(page: Path) -> list[str]:
    """The links of `page` that lead nowhere, each as `target: reason`."""
    broken = []
    for target in _LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif (
            anchor
            and linked.suffix == ".md"
            and anchor not in anchors(linked.read_text(encoding="utf-8"))
        ):
            broken.append(f"{target}: no heading with the anchor #{anchor}")
    return broken


@pytest.mark.parametrize("page", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_checker_finds_links_and_catches_broken_ones(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## Mounting with mount(8) and fstab\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# A `pffs` page\n\n## Same\n\n## Same\n\n"
        "[ok](other.md#mounting-with-mount8-and-fstab) [ok](#a-pffs-page) [ok](#same-1)\n"
        "[a link over\ntwo lines](other.md) ![image](other.md) [site](https://example.com/x)\n"
        "`[in code](missing.md)`\n\n```\n[in a block](missing.md)\n```\n"
        "[gone](missing.md) [bad anchor](other.md#nowhere) [here](#same-2)\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "other.md#nowhere: no heading with the anchor #nowhere",
        "#same-2: no heading with the anchor #same-2",
    ]


def test_the_readme_is_a_front_page() -> None:
    """The README stays short and links the manual's pages; the manual lives in docs/."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 300
    linked = set(_LINK.findall(_prose(readme)))
    for page in ("USAGE", "CACHE", "SEMANTICS", "KUBERNETES", "FLUID", "OBSERVABILITY"):
        assert f"docs/{page}.md" in linked
    for page in ("RELIABILITY", "SECURITY", "BENCHMARKS", "ARCHITECTURE"):
        assert f"docs/{page}.md" in linked
