"""Data: simulators with their NumPyro models, ratings data (simulated or MovieLens), and the
posteriordb reference posteriors.

* :mod:`~numpyro_sg.datasets.simulators`: simulated regressions and spike-and-slab designs with
  the matching NumPyro models (every public name is re-exported here);
* :mod:`~numpyro_sg.datasets.ratings`: matrix-factorisation models (BPMF, PPMF), the ratings
  simulator and the offline MovieLens loader (re-exported here);
* :mod:`~numpyro_sg.datasets.networks`: a one-hidden-layer network classifier, a LeNet with
  spike-and-slab fully connected layers and scikit-learn's handwritten digits;
* :mod:`~numpyro_sg.datasets.posteriordb`: reference draws of posteriordb posteriors;
* :mod:`~numpyro_sg.datasets.reproductions`: the skew-normal toy target and the figure helpers
  of the published SGBD experiments.
"""

from numpyro_sg.datasets.simulators import *  # noqa: F401,F403
from numpyro_sg.datasets.simulators import __all__ as _simulators_all

__all__ = list(_simulators_all)
