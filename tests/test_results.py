"""The reproductions' numbers a reader can check without rerunning them: every folder of
docs/results/ (written by a driver's --action=publish: runs.jsonl, summary.json, tables.md) has its
tables made again here from its committed rows alone, with the driver's own table code; every table
README.md or a docs/ page quotes from one (the line `<!-- results: FOLDER TABLE -->` just above it) is
that table, to the character; and every other number with a decimal point in their prose and tables
is accounted for (numbers_not_accounted_for)."""
import importlib
import re
from pathlib import Path

import pytest

from experiments import runner

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
# the four reproductions the README reports (issue 41): each commits its rows
REPRODUCTIONS = ("repro_splade", "repro_heads_cpt", "repro_simreg", "repro_mlm_clm")
MARK = re.compile(r"^<!-- results: (\S+) (.+?) -->$")


def folders():
    return sorted(p for p in RESULTS.iterdir() if (p / "summary.json").exists()) if RESULTS.exists() else []


def readme_quotes(text):
    """[(folder, table name, the table as the README has it)]: the lines after each mark up to the
    first that is not a table line."""
    lines, found = text.splitlines(), []
    for i, line in enumerate(lines):
        m = MARK.match(line)
        if m:
            table = []
            for row in lines[i + 1:]:
                if not row.startswith("|"):
                    break
                table.append(row)
            found.append((m[1], m[2], "\n".join(table) + "\n"))
    return found


def table_lines(block):
    """The markdown table of a published block (its lines that start with "|"), as the README quotes it."""
    return "\n".join(line for line in block.splitlines() if line.startswith("|")) + "\n"


def mismatches(text):
    """What of a README's quoted tables is not the committed table."""
    wrong = []
    for folder, name, table in readme_quotes(text):
        committed = runner.published_tables(RESULTS / folder) if (RESULTS / folder / "tables.md").exists() else {}
        if name not in committed:
            wrong.append(f"README quotes {folder}'s table {name!r}, which docs/results/{folder}/tables.md does not have")
        elif table != table_lines(committed[name]):
            wrong.append(f"README's {folder} {name!r} table differs from docs/results/{folder}/tables.md: paste it "
                         "again from there")
    return wrong


def test_every_reproduction_commits_its_rows():
    assert sorted(REPRODUCTIONS) == sorted(set(REPRODUCTIONS) & {p.name for p in folders()})
    for folder in folders():
        lines = (folder / "runs.jsonl").read_text().splitlines()
        assert lines, f"{folder}: no rows"
        published = runner.read_published(folder, "x")["published"]
        assert published["commit"] and published["date"], f"{folder}: the commit and date that made it"


@pytest.mark.parametrize("folder", folders(), ids=lambda p: p.name)
def test_the_committed_tables_are_made_from_the_committed_rows(folder):
    summary = runner.read_published(folder, "rows")["published"]
    driver = importlib.import_module(summary["driver"].removesuffix(".py").replace("/", "."))
    record = runner.read_published(folder, summary["rows"])
    assert driver.tables(record) == runner.published_tables(folder), \
        f"{folder}/tables.md is not what {summary['driver']} makes of runs.jsonl and summary.json"


def pages():
    """README.md and the docs/ pages: every text that quotes a result."""
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def test_the_pages_quote_the_committed_tables():
    texts = {p.name: p.read_text() for p in pages()}
    assert {f for text in texts.values() for f, _, _ in readme_quotes(text)} >= set(REPRODUCTIONS), \
        "each reproduction's tables are quoted from its committed rows"
    assert {name: mismatches(text) for name, text in texts.items() if mismatches(text)} == {}


# A number with a decimal point, not part of a version (2.13.0) or of a longer number
DECIMAL = re.compile(r"(?<![\d.])\d+\.\d+(?![\d.])")
NUMBERS_MARK = re.compile(r"^<!-- numbers: (.*) -->$")


def prose_blocks(text):
    """The page's blocks (runs of non-blank lines) outside code (fenced, or indented by 4 spaces),
    each without its inline code (`...`: commands, settings, file names), with the numbers mark that
    opens it, if any."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    for block in re.split(r"\n\s*\n", text):
        if all(line.startswith("    ") for line in block.splitlines()):
            continue
        lines = block.strip().splitlines()
        mark = NUMBERS_MARK.match(lines[0]) if lines else None
        yield (mark[1] if mark else None), re.sub(r"`[^`]*`", "", "\n".join(lines[1:] if mark else lines))


def numbers_not_accounted_for(text):
    """Every number with a decimal point in a page's prose or tables must be accounted for, so
    that a result changed by hand, or quoted without rows, fails. A block (paragraph, list or table)
    that holds one opens with `<!-- numbers: ... -->`, whose words are docs/results/ folders and
    numbers: each decimal of the block is a cell of one of those folders' tables.md (the rows), or
    is written in the mark itself (a paper's number, a setting, a count: visible to a reviewer, and
    a change to the block alone fails). Tables under `<!-- results: ... -->` are compared whole by
    mismatches. Integers (steps, seeds, k) are not checked."""
    wrong = []
    for mark, block in prose_blocks(text):
        if block.startswith("<!-- results: "):
            continue
        found = DECIMAL.findall(block)
        words = (mark or "").replace(";", " ").replace(",", " ").split()
        allowed = set(DECIMAL.findall(mark or ""))
        for folder in words:
            if (RESULTS / folder / "tables.md").exists():
                allowed |= set(DECIMAL.findall((RESULTS / folder / "tables.md").read_text()))
        for number in found:
            if number not in allowed:
                where = f"its mark names {mark!r}" if mark else "it has no <!-- numbers: ... --> mark"
                wrong.append(f"{number} in {block[:60]!r}...: not in the rows or the mark ({where})")
    return wrong


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_every_quoted_number_comes_from_its_rows(page):
    assert numbers_not_accounted_for(page.read_text()) == []


def test_a_number_changed_in_prose_is_caught():
    """The check itself: a result of the rows passes in a marked paragraph; the same paragraph with
    the number changed, or without its mark, or a number declared in the mark changed in the text,
    fails."""
    ok = "<!-- numbers: repro_simreg; the paper's 61.3 -->\nSimReg: 40.3 % fewer steps (the paper: 61.3°).\n"
    assert numbers_not_accounted_for(ok) == []
    assert len(numbers_not_accounted_for(ok.replace("40.3 %", "40.4 %"))) == 1
    assert len(numbers_not_accounted_for(ok.replace("61.3°", "61.4°"))) == 1
    assert len(numbers_not_accounted_for(ok.split("\n", 1)[1])) == 2
    assert numbers_not_accounted_for("`lr=0.5` and torch 2.13.0, 3 seeds\n\n```\n0.123\n```\n") == []


def test_a_quote_that_differs_from_the_committed_table_is_caught():
    """The comparison itself: one digit changed in the first quoted table, or its mark naming a
    table that was not published, is found."""
    text = (ROOT / "docs" / "splade_rescaling.md").read_text()
    folder, name, table = readme_quotes(text)[0]
    changed = re.sub(r"\d", lambda m: str((int(m[0]) + 1) % 10), table, count=1)
    assert len(mismatches(text.replace(table, changed, 1))) == 1
    mark = f"<!-- results: {folder} {name} -->"
    assert "does not have" in mismatches(text.replace(mark, f"<!-- results: {folder} no_such -->", 1))[0]
