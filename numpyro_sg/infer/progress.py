"""The warmup's progress bar: one ``tqdm`` bar from the model trace to the end of the mode search.

A kernel's ``init`` opens it (:func:`warmup_progress`) before it traces the model, and names each
step on it (model trace, local latents, the mode search's phases), so that a long warmup shows
output from its first second; :func:`~numpyro_sg.infer.warmup.find_mode` run inside it uses the
same bar.  Shown when ``WarmupOptions.show_progress()`` (a terminal or a Jupyter kernel).
"""

from __future__ import annotations

import contextlib
import contextvars
import sys

from tqdm.auto import tqdm

__all__ = ["warmup_progress", "interactive"]


def interactive() -> bool:
    """Whether progress bars are shown by default: ``stderr`` is a terminal, or the process is a
    Jupyter kernel (``tqdm.auto`` then draws a widget)."""
    return bool(getattr(sys.stderr, "isatty", lambda: False)()) or "ipykernel" in sys.modules

_progress_bar = contextvars.ContextVar("warmup_progress_bar", default=None)


@contextlib.contextmanager
def warmup_progress(options):
    """The warmup's ``tqdm`` bar for ``options`` (a ``WarmupOptions``), or the one already open
    in this context (module docstring)."""
    active = _progress_bar.get()
    if active is not None:
        yield active
        return
    with tqdm(desc="warmup", leave=False, disable=not options.show_progress()) as bar:
        token = _progress_bar.set(bar)
        try:
            yield bar
        finally:
            _progress_bar.reset(token)
