"""Variable-selection summaries (numpyro_sg.results.selection): inclusion probabilities from every
input form, the median probability model, FSR / NSR / MSE₁ / MSE₀, and the plot."""

import numpy as np
import pytest

from numpyro_sg.results import selection as sel
from numpyro_sg.arviz_compat import from_dict


def test_metrics_by_hand():
    beta_true = np.array([1.0, -1.0, 0.0, 0.0, 0.0])
    selected = np.array([True, False, True, False, False])
    beta_hat = np.array([0.9, 0.0, 0.2, 0.0, -0.1])
    m = sel.selection_metrics(selected, beta_hat, beta_true)
    assert m["FSR"] == pytest.approx(1 / 2)  # |Ŝ∖S*|/|Ŝ| = 1/2
    assert m["NSR"] == pytest.approx(1 / 2)  # |S*∖Ŝ|/|S*| = 1/2
    assert m["MSE1"] == pytest.approx((0.1**2 + 1.0) / 2)
    assert m["MSE0"] == pytest.approx((0.04 + 0 + 0.01) / 3)
    assert sel.selection_metrics(np.zeros(5, bool), beta_hat, beta_true)["FSR"] == 0.0


def test_inclusion_from_every_form():
    rng = np.random.default_rng(0)
    incl = rng.random((2, 50, 4))  # (chains, draws, p)
    gamma = (rng.random((2, 50, 4)) < 0.3).astype(np.int32)
    beta = rng.normal(size=(2, 50, 4))
    want = incl.reshape(-1, 4).mean(0)
    np.testing.assert_allclose(sel.inclusion_probabilities(incl), want)
    np.testing.assert_allclose(sel.inclusion_probabilities({"inclusion": incl.reshape(-1, 4)}), want)
    idata = from_dict(posterior={"inclusion": incl, "gamma": gamma, "beta": beta})
    np.testing.assert_allclose(sel.inclusion_probabilities(idata), want)
    np.testing.assert_allclose(sel.inclusion_probabilities(idata, indicator="gamma"), gamma.reshape(-1, 4).mean(0))
    np.testing.assert_allclose(sel.inclusion_probabilities({"gamma": gamma}), gamma.reshape(-1, 4).mean(0))
    np.testing.assert_allclose(sel.posterior_mean(idata, thin=10), beta[:, ::10].reshape(-1, 4).mean(0))
    with pytest.raises(KeyError, match="pass var_name"):
        sel.inclusion_probabilities({"theta": beta})
    with pytest.raises(TypeError):
        sel.inclusion_probabilities("nonsense")
    summary = sel.selection_summary(idata, np.array([1.0, 0, 0, 0]))
    assert list(summary.columns) == ["variable", "inclusion", "selected", "beta_hat", "beta_true",
                                     "inclusion_sd", "inclusion_r_hat"]
    assert set(summary.attrs) >= {"FSR", "NSR", "MSE1", "MSE0", "num_selected"}
    np.testing.assert_array_equal(summary["selected"], want > 0.5)
    np.testing.assert_allclose(summary["inclusion"], want)
    assert list(sel.selection_summary(idata, names=list("abcd")).variable) == list("abcd")
    assert "beta_true" not in sel.selection_summary(idata).columns
    with pytest.raises(ValueError, match="beta_true"):
        sel.selection_summary(idata, np.zeros(3))


def test_plot(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    probs = np.array([0.99, 0.02, 0.6, 0.1])
    ax = sel.plot_inclusion_probabilities(probs, beta_true=[1, 0, 1, 0])
    ax.figure.savefig(tmp_path / "incl.png")
    ax2 = sel.plot_inclusion_probabilities({"inclusion": probs[None]}, top=2)
    assert len(ax2.get_xticks()) == 2
