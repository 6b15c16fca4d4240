"""Sphinx configuration for the numpyro_sg documentation.

Build (offline, warnings are errors)::

    sphinx-build -W --keep-going -b html docs docs/_build/html

The site follows the PyData layout used by ArviZ: pydata-sphinx-theme, MyST Markdown pages and
an API reference generated from the package docstrings (reST ``:param x:`` fields, so no
napoleon).  Nothing here needs network access: intersphinx is deliberately not enabled.
"""

from __future__ import annotations

import os
import sys
from datetime import date

# Build against the checkout even when the package is not installed.
sys.path.insert(0, os.path.abspath(".."))

import numpyro_sg  # noqa: E402

# -- Project information ---------------------------------------------------------------------
project = "numpyro_sg"
author = "numpyro_sg developers"
copyright = f"{date.today().year}, {author}"
version = numpyro_sg.__version__
release = numpyro_sg.__version__

# -- General configuration -------------------------------------------------------------------
extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
language = "en"

# MyST: $...$ / $$...$$ maths, ```{eval-rst} blocks, ::: fences, definition lists.
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# -- autodoc ---------------------------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"show-inheritance": True}
# Do not show a base class's docstring (e.g. NumPyro's "To be implemented by subclasses.") on
# methods that the package overrides without documenting them.
autodoc_inherit_docstrings = False
# The package imports jax/numpyro at import time; both are installed with the package, so
# nothing is mocked (mocking would hide real import errors in the API pages).

# -- HTML output -----------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = "numpyro_sg"
html_theme_options = {
    "navbar_align": "left",
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version", "theme-version"],
}
html_context = {"default_mode": "auto"}
html_show_sourcelink = False


# -- Docstring clean-up ----------------------------------------------------------------------
# The package docstrings write maths in plain Unicode, which is not always valid reST:
#   * absolute values such as ``|z|·τ̂`` parse as reST substitution references ``|z|`` and fail
#     with "Undefined substitution referenced";
#   * a literal followed directly by letters (e.g. ``vmap``s) is not recognised as the end of
#     the inline literal.
# Rather than silencing those errors (``suppress_warnings`` cannot target docutils errors, and
# would hide real problems), this hook escapes them before docutils parses the docstring.  It
# only touches text outside inline literals and interpreted text, and an escaped ``\|``
# renders as a plain ``|``, so nothing else in the rendered output changes.
import re  # noqa: E402

_INLINE_CODE = re.compile(r"(``.+?``|`[^`]+`)")
_BARS = re.compile(r"(?<![\\|])\|(?=\S)([^|`\n]*?\S)\|(?![_|])")


def _escape_docstring_line(line: str) -> str:
    parts = _INLINE_CODE.split(line)  # odd parts: inline literals / roles, left to right
    for k in range(0, len(parts), 2):  # even parts: plain text
        parts[k] = _BARS.sub(r"\\|\1\\|", parts[k])
        after_literal = k > 0 and parts[k - 1].startswith("``")
        if after_literal and parts[k][:1].isalnum():
            parts[k] = "\\ " + parts[k]  # ``vmap``s -> ``vmap``\ s (escaped space)
    return "".join(parts)


def _clean_docstring(app, what, name, obj, options, lines):
    lines[:] = [_escape_docstring_line(line) for line in lines]


def setup(app):
    app.connect("autodoc-process-docstring", _clean_docstring)
