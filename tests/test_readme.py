"""The README's `Use` snippet runs as written (at a smaller N) and agrees with NUTS."""

import re
import warnings
from pathlib import Path

import numpyro_sg as nsg

README = Path(__file__).resolve().parents[1] / "README.md"


def _use_snippet() -> str:
    text = README.read_text()
    section = text[text.index("## Use"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_use_snippet_converges_against_nuts(tmp_path):
    """The snippet with N = 20,000 instead of 100,000 (and the NUTS cache in a temporary
    folder): no convergence warning, ξ(σ̂) ≤ 0.08 and max |mean error| ≤ 0.2 NUTS sd (NUTS's
    default 1,000 draws carry a ≈ 2–3% sd error of their own; measured ξ ≈ 0.03)."""
    code = _use_snippet()
    assert "simulate_logistic_regression(100_000, 10)" in code and 'cache_dir=".nuts"' in code
    code = code.replace("100_000", "20_000").replace('cache_dir=".nuts"', f'cache_dir="{tmp_path}"')
    code = code.replace("print(", "(")  # keep the test's output quiet
    namespace = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", nsg.ConvergenceWarning)
        exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 - our own README
    table = namespace["table"]
    assert table.attrs["xi_sd"] <= 0.08, table
    assert table["mean_err"].abs().max() <= 0.2, table
