"""The site names of a spike-and-slab kernel (:class:`SpikeSlabSites`): which model sites are
the indicator and the coefficient, and the names of the outputs the kernels add."""

from __future__ import annotations

from dataclasses import dataclass

from numpyro_sg.infer.options import Options

__all__ = ["SpikeSlabSites"]


@dataclass(frozen=True)
class SpikeSlabSites(Options):
    """Site names of :class:`~numpyro_sg.ESGLD` and :class:`~numpyro_sg.SparseAsync`: their
    ``sites`` (``None``, a dict of these fields or an instance).

    :param indicator: name of the indicator site γ (found automatically when ``None``).
    :param coefficient: name of the coefficient site θ (found automatically when ``None``).
    :param effective: output name of β = θ·γ (default ``None``: ``"beta"``, or
        ``"<coefficient>_eff"`` when the model has a non-deterministic site called ``beta``); a
        deterministic site of the model with that name is used as is.
    :param str inclusion: output name of ESGLD's inclusion frequency (default ``"inclusion"``;
        ESGLD only).

    >>> SpikeSlabSites.of({"indicator": "gamma"})
    SpikeSlabSites(indicator='gamma', coefficient=None, effective=None, inclusion='inclusion')
    """

    indicator: str | None = None
    coefficient: str | None = None
    effective: str | None = None
    inclusion: str = "inclusion"

    ARGUMENT = "sites"
    LABEL = "site name"

    def __post_init__(self):
        for name in ("indicator", "coefficient", "effective", "inclusion"):
            value = getattr(self, name)
            if not (isinstance(value, str) and value) and not (value is None and name != "inclusion"):
                kind = "a site name (str)" if name == "inclusion" else "a site name (str) or None"
                raise ValueError(f"sites: {name} must be {kind}, got {value!r}.")
