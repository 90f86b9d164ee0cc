"""The reproductions' numbers a reader can check without rerunning them: every folder of
docs/results/ (written by a driver's --action=publish: runs.jsonl, summary.json, tables.md) has its
tables made again here from its committed rows alone, with the driver's own table code, and every
table the README quotes from one (the line `<!-- results: FOLDER TABLE -->` just above it) is that
table, to the character."""
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


def test_the_readme_quotes_the_committed_tables():
    text = (ROOT / "README.md").read_text()
    assert {f for f, _, _ in readme_quotes(text)} >= set(REPRODUCTIONS), \
        "each reproduction's tables in the README come from its committed rows"
    assert mismatches(text) == []


def test_a_quote_that_differs_from_the_committed_table_is_caught():
    """The comparison itself: one digit changed in the first quoted table, or its mark naming a
    table that was not published, is found."""
    text = (ROOT / "README.md").read_text()
    folder, name, table = readme_quotes(text)[0]
    changed = re.sub(r"\d", lambda m: str((int(m[0]) + 1) % 10), table, count=1)
    assert len(mismatches(text.replace(table, changed, 1))) == 1
    mark = f"<!-- results: {folder} {name} -->"
    assert "does not have" in mismatches(text.replace(mark, f"<!-- results: {folder} no_such -->", 1))[0]
