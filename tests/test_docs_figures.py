"""Every task page of the user guide shows its output figure, made by the page's own code.

A page shows ``![…](images/X.png)``, ``docs/images/X.png`` exists (under 200 kB), and a python
block of the page that runs in CI saves ``X.png`` (``plt.savefig("X.png", …)``), so that
``python docs/make_figures.py PAGE`` regenerates it from the page's code.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_docs_snippets import blocks

DOCS = Path(__file__).resolve().parents[1] / "docs"
TASK_PAGES = ["getting_started", "choosing", "big_data", "esgld", "tuning", "diagnostics",
              "checking_nuts", "local_latents", "troubleshooting"]
IMAGE = re.compile(r"!\[[^\]]+\]\(images/([\w.-]+\.png)\)")
SAVES = re.compile(r"""savefig\(\s*["']([\w.-]+\.png)["']""")
MAX_BYTES = 200_000


def saved_figures(text: str) -> set[str]:
    """The file names that the page's CI-run blocks save with ``savefig``."""
    return {name for _, code, skip in blocks(text) if skip is None for name in SAVES.findall(code)}


@pytest.mark.parametrize("page", TASK_PAGES)
def test_task_page_shows_figure_of_its_code(page):
    text = (DOCS / f"{page}.md").read_text(encoding="utf-8")
    images = IMAGE.findall(text)
    assert images, f"{page}.md shows no figure ![...](images/X.png)"
    for name in images:
        path = DOCS / "images" / name
        assert path.is_file(), f"{page}.md shows images/{name}, which does not exist"
        assert path.stat().st_size < MAX_BYTES, f"images/{name}: {path.stat().st_size} bytes"
    if page == "diagnostics":  # its figure comes from examples/ksd_diagnostics.py (named on the page)
        assert "examples/ksd_diagnostics.py --out docs/images/ksd_vs_time.png" in text
        return
    made = saved_figures(text) & set(images)
    assert made, f"{page}.md: no CI-run block saves the figure it shows ({images})"


def test_figure_finder_sees_saves_and_skips():
    text = ("```python\nplt.savefig('a.png', dpi=80)\n```\n"
            "<!-- skip-ci: slow -->\n```python\nplt.savefig(\"b.png\")\n```\n")
    assert saved_figures(text) == {"a.png"}
    assert IMAGE.findall("![a figure](images/a.png) ![](images/c.png)") == ["a.png"]
