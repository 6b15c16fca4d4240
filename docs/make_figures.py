"""Regenerate the figure of every task page of the user guide.

    python docs/make_figures.py [page ...]      # e.g. getting_started tuning; default: all

A page's figure is the output of its own code: the page's python blocks run as
``tests/test_docs_snippets.py`` runs them in CI (its ``ci-setup`` first, then the blocks in
order in one namespace, ``skip-ci`` blocks left out; the same block extraction, imported from
that test) but at full size, without the page's ``ci-replace`` substitutions, in a temporary
working directory (the pages' code writes data files and caches there); the figures that the
blocks save with ``plt.savefig("<name>.png", ...)`` are then copied to ``docs/images``.  Blocks
after the last one that saves a figure are not run.  The pages are those with such a block.
The pages in ``CI_SIZE`` run with their substitutions (the reason is given there).
The package is imported from this checkout.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

# Two host devices, as in the test suite (tests/conftest.py): the pages' parallel chains and
# the mesh of the big-data page run as they do in CI.  Must precede JAX's initialisation.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import matplotlib  # noqa: E402

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend

DOCS = Path(__file__).resolve().parent
IMAGES = DOCS / "images"
sys.path[:0] = [str(DOCS.parent), str(DOCS.parent / "tests")]   # this checkout's package

from test_docs_snippets import SETUP, blocks, replacements  # noqa: E402 - the CI test's own extraction

# Pages whose figure is made at CI size (with their ci-replace substitutions), and why.
CI_SIZE = {
    "tuning": "its full-size grid (mini-batches of up to 10,000 rows) exceeds its ci-setup data (2,000 rows)",
}
SAVES = re.compile(r"""savefig\(\s*["']([\w.-]+\.png)["']""")


def figure_blocks(text: str, ci_size: bool = False) -> list[tuple[int, str]]:
    """``(line, code)`` of the blocks that run, up to the last one that saves a figure; with
    ``ci_size``, with the page's ``ci-replace`` substitutions made."""
    run = []
    for line, code, skip in blocks(text):
        if skip is None:
            for old, new in (replacements(text) if ci_size else []):
                code = code.replace(old, new)
            run.append((line, code))
    last = max((i for i, (_, code) in enumerate(run) if SAVES.search(code)), default=-1)
    return run[:last + 1]


def figure_pages() -> list[str]:
    """The pages (names without ``.md``) whose code saves a figure."""
    return sorted(p.stem for p in DOCS.glob("*.md") if figure_blocks(p.read_text(encoding="utf-8")))


def make(page: str) -> list[str]:
    """Run ``page``'s blocks in a temporary directory; copy the figures they save to
    ``docs/images`` and return their names."""
    path = DOCS / f"{page}.md"
    text = path.read_text(encoding="utf-8")
    run = figure_blocks(text, ci_size=page in CI_SIZE)
    names = [name for _, code in run for name in SAVES.findall(code)]
    namespace = {"__name__": "__docs__"}
    cwd = os.getcwd()
    work = tempfile.mkdtemp(prefix=f"figures_{page}_")
    os.chdir(work)
    try:
        for setup in SETUP.finditer(text):
            exec(compile(setup.group(1), f"{path.name}:ci-setup", "exec"), namespace)  # noqa: S102
        for line, code in run:
            try:
                exec(compile(code, f"{path.name}:{line}", "exec"), namespace)  # noqa: S102 - our docs
            finally:
                plt.close("all")
        for name in names:
            shutil.copyfile(name, IMAGES / name)
    finally:
        os.chdir(cwd)
        shutil.rmtree(work, ignore_errors=True)
    return names


def main(argv: list[str]) -> None:
    pages = argv or figure_pages()
    unknown = sorted(set(pages) - set(figure_pages()))
    if unknown:
        raise SystemExit(f"no figure on page(s) {unknown}; pages with one: {figure_pages()}")
    for page in pages:
        start = time.perf_counter()
        names = make(page)
        sizes = ", ".join(f"{n} ({(IMAGES / n).stat().st_size / 1e3:.0f} kB)" for n in names)
        print(f"{page}: {sizes} in {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
