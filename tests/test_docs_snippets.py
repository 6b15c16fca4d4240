"""Every ```python block of the README and of every page under docs/ runs.

Each page is one test: its blocks run in order in one namespace (a later block may use what an
earlier one defined), in a temporary working directory, with matplotlib's Agg backend and
``print`` silenced.  New pages are picked up automatically (``docs/**/*.md``).  Markers, as HTML
comments (invisible on the rendered page):

* ``<!-- skip-ci: reason -->`` on the line just before a block: that block is not run (too slow
  for the default suite, or run by another test); the reason is required.
* ``<!-- ci-replace: OLD => NEW -->`` anywhere on the page: every block of the page runs with
  the text ``OLD`` replaced by ``NEW`` (a smaller data set or fewer draws); ``OLD`` must occur.
* a block written as a console session (``>>>`` prompts) runs its input lines.
* ``<!-- skip-ci-page: reason -->`` anywhere on the page: no block of the page runs.
* ``<!-- ci-setup`` … ``-->`` (the code on the lines in between): runs before the page's first
  block, for pages whose snippets continue a run set up elsewhere (a small model and data).

Blocks in other languages (``bash``, ``text``) are not run.  A page with blocks gets a
``heavy`` mark when it declares ``<!-- ci-heavy -->`` (run on the pinned stack only).
"""

from __future__ import annotations

import builtins
import os
import re
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)
SKIP = re.compile(r"<!--\s*skip-ci:\s*(\S.*?)\s*-->\s*$")
REPLACE = re.compile(r"<!--\s*ci-replace:\s*(.+?)\s*=>\s*(.*?)\s*-->")
SKIP_PAGE = re.compile(r"<!--\s*skip-ci-page:\s*(\S.*?)\s*-->")
SETUP = re.compile(r"^<!--\s*ci-setup\s*\n(.*?)^-->", re.S | re.M)


def pages() -> list[Path]:
    """The README and every Markdown page of the documentation (new pages included)."""
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def blocks(text: str) -> list[tuple[int, str, str | None]]:
    """``(line, code, skip reason or None)`` of every python block of a page."""
    out = []
    for match in BLOCK.finditer(text):
        before = text[:match.start()].rstrip("\n").splitlines()
        skip = SKIP.search(before[-1]) if before else None
        code = _strip_prompts(match.group(1))
        out.append((text.count("\n", 0, match.start()) + 2, code, skip and skip.group(1)))
    return out


def _strip_prompts(code: str) -> str:
    """A block written as a console session (``>>>``/``...`` prompts): its input lines only."""
    if not code.lstrip().startswith(">>>"):
        return code
    return "\n".join(line[4:] for line in code.splitlines() if line.startswith((">>> ", "... ", ">>>", "...")))


def replacements(text: str) -> list[tuple[str, str]]:
    """The page's ``ci-replace`` pairs."""
    return [(m.group(1), m.group(2)) for m in REPLACE.finditer(text)]


def _params():
    out = []
    for path in pages():
        text = path.read_text(encoding="utf-8")
        if not blocks(text):
            continue
        marks = [pytest.mark.heavy] if "<!-- ci-heavy -->" in text else []
        out.append(pytest.param(path, id=str(path.relative_to(ROOT)), marks=marks))
    return out


def test_markers_are_well_formed():
    """A skip marker names its reason; a replacement's text occurs on its page."""
    for path in pages():
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"<!--\s*skip-ci:\s*-->", text), f"{path.name}: skip-ci without a reason"
        code = "".join(c for _, c, _ in blocks(text))
        for old, _ in replacements(text):
            assert old in code, f"{path.name}: ci-replace {old!r} matches no code"


@pytest.mark.parametrize("path", _params())
def test_page_code_runs(path, tmp_path, monkeypatch):
    text = path.read_text(encoding="utf-8")
    skip_page = SKIP_PAGE.search(text)
    if skip_page:
        pytest.skip(skip_page.group(1))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(builtins, "print", lambda *a, **k: None)
    import matplotlib.pyplot as plt

    namespace = {"__name__": "__docs__"}
    for setup in SETUP.finditer(text):
        exec(compile(setup.group(1), f"{path.name}:ci-setup", "exec"), namespace)  # noqa: S102
    ran = 0
    for line, code, skip in blocks(text):
        if skip is not None:
            continue
        for old, new in replacements(text):
            code = code.replace(old, new)
        try:
            exec(compile(code, f"{path.name}:{line}", "exec"), namespace)  # noqa: S102 - our own docs
        except Exception as e:  # noqa: BLE001 - name the block that failed
            raise AssertionError(f"{path.relative_to(ROOT)}, block at line {line}: "
                                 f"{type(e).__name__}: {e}") from e
        finally:
            plt.close("all")
        ran += 1
    if not ran:
        pytest.skip("every block of the page is marked skip-ci")
    assert os.getcwd() == str(tmp_path)
