"""Progress bars for the two long phases around the sampling loop: the warmup and the conversion.

* :func:`warmup_progress`: a kernel's ``init`` opens one ``tqdm`` bar before it traces the
  model and names each step on it (model trace, local latents, the mode search's phases), so
  that a long warmup shows output from its first second; :func:`~numpyro_sg.infer.warmup.find_mode`
  run inside it uses the same bar.  Shown when ``WarmupOptions.show_progress()``.
* :func:`conversion_progress`: :func:`numpyro_sg.to_inference_data` opens one bar for the whole
  conversion (model traces, the locals' posterior, the full-data scores, the KSD); it appears
  once the conversion has run :data:`CONVERSION_BAR_DELAY` seconds, so quick ones print nothing.

Inside either, :func:`progress_phase` names the current step and :func:`progress_steps` counts
the blocks of a loop on the open bar ("full-data scores 3/25").  Bars are shown when
:func:`interactive` (a terminal or a Jupyter kernel).
"""

from __future__ import annotations

import contextlib
import contextvars
import sys

from tqdm.auto import tqdm

#: seconds a conversion runs before its bar appears
CONVERSION_BAR_DELAY = 2.0


def interactive() -> bool:
    """Whether progress bars are shown by default: ``stderr`` is a terminal, or the process is a
    Jupyter kernel (``tqdm.auto`` then draws a widget)."""
    return bool(getattr(sys.stderr, "isatty", lambda: False)()) or "ipykernel" in sys.modules

_progress_bar = contextvars.ContextVar("progress_bar", default=None)


@contextlib.contextmanager
def _open_bar(show: bool, **tqdm_options):
    """The bar already open in this context, or a new one (``tqdm_options``) made the open one
    until the block ends."""
    active = _progress_bar.get()
    if active is not None:
        yield active
        return
    with tqdm(leave=False, disable=not show, **tqdm_options) as bar:
        token = _progress_bar.set(bar)
        try:
            yield bar
        finally:
            _progress_bar.reset(token)


def warmup_progress(options):
    """The warmup's ``tqdm`` bar for ``options`` (a ``WarmupOptions``), or the one already open
    in this context (module docstring)."""
    return _open_bar(options.show_progress(), desc="warmup")


def conversion_progress():
    """The conversion's ``tqdm`` bar (module docstring): counts blocks of work, names the phase."""
    return _open_bar(interactive(), desc="to_inference_data", unit="block", delay=CONVERSION_BAR_DELAY)


def _show(bar, text: str) -> None:
    """Put ``text`` after the bar, drawing it now unless it is still within its delay."""
    bar.set_postfix_str(text, refresh=False)
    if not bar.disable and bar._time() >= bar.start_t + bar.delay:
        bar.refresh()


def progress_phase(name: str) -> None:
    """Name the current step on the open bar (none open: nothing)."""
    bar = _progress_bar.get()
    if bar is not None:
        _show(bar, name)


def progress_steps(items, name: str, standalone_min: int | None = None):
    """Iterate ``items``, counting each on the open bar as ``"name k/K"``.

    A loop inside another counted loop is not counted again.  With no bar open, the items get a
    bar of their own when there are at least ``standalone_min`` of them and output is
    :func:`interactive` (``None``: never).
    """
    items = list(items)
    bar = _progress_bar.get()
    if bar is None or getattr(bar, "nsg_counting", False):
        own = bar is None and standalone_min is not None and len(items) >= standalone_min
        yield from tqdm(items, desc=name, leave=False, disable=not interactive()) if own else items
        return
    bar.nsg_counting = True
    try:
        for k, item in enumerate(items):
            _show(bar, f"{name} {k}/{len(items)}")
            yield item
            bar.update(1)
    finally:
        bar.nsg_counting = False
