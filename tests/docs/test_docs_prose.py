"""The README and docs read in one pass: short sentences, a short README, links that resolve.

A sentence is cut after ``.``, ``!`` or ``?`` followed by a space and a capital, a digit, a
backtick, a parenthesis or a quote; code blocks, tables, headings and comment markers are left
out, inline code counts as one word. Generated regions count: their prose comes from the
benchmark scripts, which write short sentences too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: the longest sentence a reader takes in one pass
MAX_WORDS = 40
#: the files held to :data:`MAX_WORDS`
SHORT = ["README.md", "docs/first-ten-minutes.md", "docs/benchmarks.md", "docs/demo.md",
         "docs/dflash.md", "docs/doctor.md", "docs/metrics.md", "docs/planner.md",
         "docs/pytorch.md", "docs/training.md"]
ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.")


def blocks(text: str) -> list[str]:
    """Paragraphs and list items, one string each, without code, tables and headings."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    out: list[str] = []
    current: list[str] = []
    for line in [*text.splitlines(), ""]:
        s = line.strip()
        item = re.match(r"^([-*+]|\d+[.)])\s+", s)
        if not s or s.startswith(("|", "#", "![")) or item:
            if current:
                out.append(" ".join(current))
            current = [s[item.end():]] if item else []
            continue
        current.append(s)
    return out


def sentences(text: str) -> list[str]:
    """Every sentence of a Markdown text.

    >>> sentences("One `a. B` here. Two (e.g. this).\\n- an item\\n\\n```\\nno. Code.\\n```")
    ['One CODE here.', 'Two (e.g. this).', 'an item']
    """
    found: list[str] = []
    for block in blocks(text):
        block = re.sub(r"`[^`]*`", "CODE", block)
        block = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", block)
        for a in ABBREVIATIONS:
            block = block.replace(a, a.replace(".", "\0"))
        for s in re.split(r"(?<=[.!?])[\"')\]*]*\s+(?=[A-Z0-9`(\"'*_])", block):
            s = s.replace("\0", ".").strip()
            if s:
                found.append(s)
    return found


def words(sentence: str) -> int:
    """Words of a sentence: runs of text holding a letter or a digit."""
    return len([w for w in sentence.split() if re.search(r"\w", w)])


def test_sentences_are_cut_where_a_reader_stops():
    text = "A short one. Another, with `code. Inside` it!\n\n- an item\n- another item. Two."
    assert [words(s) for s in sentences(text)] == [3, 4, 2, 2, 1]
    assert sentences("| a. B | c |\n\n# Heading. Two\n") == []


@pytest.mark.parametrize("name", SHORT)
def test_no_sentence_over_40_words(name):
    long = [(words(s), s[:80]) for s in sentences((ROOT / name).read_text())
            if words(s) > MAX_WORDS]
    assert not long, long


def test_the_readme_is_read_in_three_minutes():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150
    rows = [0]
    for line in lines:  # the longest table, in rows below its header
        rows.append(rows[-1] + 1 if line.startswith("|") else 0)
    assert max(rows) - 2 <= 8


@pytest.mark.parametrize("name", ["README.md", *sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))])
def test_relative_links_resolve(name):
    path = ROOT / name
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text())
    missing = [t for t in targets if "://" not in t and not (path.parent / t).exists()]
    assert not missing, missing
