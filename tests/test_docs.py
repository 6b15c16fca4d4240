"""The documentation builds offline and without a single Sphinx warning."""

import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_docs_build_without_warnings(tmp_path):
    pytest.importorskip("sphinx", reason="sphinx is not installed (pip install -e '.[docs]')")
    pytest.importorskip(
        "pydata_sphinx_theme", reason="pydata-sphinx-theme is not installed (pip install -e '.[docs]')"
    )
    pytest.importorskip("myst_parser", reason="myst-parser is not installed (pip install -e '.[docs]')")
    cmd = [
        sys.executable, "-m", "sphinx",
        "-W", "--keep-going",
        "-b", "html",
        str(DOCS), str(tmp_path / "html"),
        "-d", str(tmp_path / "doctrees"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        print(proc.stdout[-5000:])
        print(proc.stderr, file=sys.stderr)
    assert proc.returncode == 0, f"sphinx-build failed (rc={proc.returncode}):\n{proc.stderr}"
    assert (tmp_path / "html" / "index.html").is_file()
