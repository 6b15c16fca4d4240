"""The one place where ArviZ 0.x and ArviZ ≥ 1 differ for this package.

ArviZ 0.x stores a run in an ``arviz.InferenceData``; ArviZ 1.x (``arviz-base``,
``arviz-stats``, ``arviz-plots``) stores it in an ``xarray.DataTree`` whose children are the
same groups (``posterior``, ``sample_stats``, ``observed_data``, ``log_likelihood``, …).  The
package reads and writes runs only through the functions here, so the rest of it does not
depend on the ArviZ version:

* :func:`from_dict`, :func:`from_numpyro`: make the installed ArviZ's native object;
* :func:`is_run_data`, :func:`group_names`, :func:`has_group`, :func:`get_group`,
  :func:`set_group`, :func:`rename_vars`, :func:`select_chains`: read and edit its groups
  (a group is handed out as an ``xarray.Dataset``);
* :func:`to_netcdf`, :func:`from_netcdf`: the file round trip;
* :func:`plot_densities`: overlaid marginal densities of several runs.

ArviZ's own ``summary``, ``ess``, ``rhat`` and ``convert_to_dataset`` take the same arguments
in both versions and are called directly.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import arviz as az
import numpy as np
import xarray as xr
from numpyro.infer import MCMC

__all__ = ["from_dict", "from_numpyro", "is_run_data", "group_names", "has_group", "get_group",
           "set_group", "rename_vars", "select_chains", "to_netcdf", "from_netcdf",
           "plot_densities"]

#: the installed ArviZ's major version
ARVIZ_MAJOR = int(az.__version__.split(".")[0])
#: ``True`` with ArviZ ≥ 1 (runs are ``xarray.DataTree``), ``False`` with ArviZ 0.x
USES_DATATREE = ARVIZ_MAJOR >= 1


def from_dict(posterior: dict | None = None, **groups):
    """The installed ArviZ's object of a run from draws: ``{group: {name: array}}``.

    :param dict posterior: ``{name: (chains, draws, …) array}``.
    :param groups: further groups (``sample_stats``, ``observed_data``, …), each a dict.
    :return: an ``InferenceData`` (ArviZ 0.x) or an ``xarray.DataTree`` (ArviZ ≥ 1).

    **Example:**

    >>> import numpy as np
    >>> from numpyro_sg.arviz_compat import from_dict, group_names
    >>> idata = from_dict(posterior={"theta": np.zeros((2, 10, 3))})
    >>> group_names(idata), idata.posterior["theta"].shape
    (['posterior'], (2, 10, 3))
    """
    groups = {k: v for k, v in {"posterior": posterior, **groups}.items() if v is not None}
    if USES_DATATREE:
        return az.from_dict(groups)
    return az.from_dict(**groups)


def from_numpyro(mcmc, **kwargs):
    """``arviz.from_numpyro`` of a NumPyro ``MCMC`` run (``log_likelihood``, ``coords``,
    ``dims``, … as in ArviZ); the installed ArviZ's native object.

    ``mcmc`` may also be a stand-in with the ``MCMC`` attributes that ArviZ reads
    (``get_samples``, ``get_extra_fields``, ``sampler.model``, ``num_chains``, …); ArviZ ≥ 1
    takes it through its ``MCMCAdapter``.
    """
    if USES_DATATREE and not isinstance(mcmc, MCMC):
        from arviz_base.io_numpyro import MCMCAdapter

        mcmc = MCMCAdapter(mcmc)
    return az.from_numpyro(mcmc, **kwargs)


def is_run_data(obj) -> bool:
    """Whether ``obj`` is an ``InferenceData`` (ArviZ 0.x) or an ``xarray.DataTree``."""
    if isinstance(obj, xr.DataTree):
        return True
    return not USES_DATATREE and isinstance(obj, az.InferenceData)


def group_names(data) -> list[str]:
    """The names of the groups of a run (``["posterior", "sample_stats", …]``)."""
    if isinstance(data, xr.DataTree):
        return list(data.children)
    return list(data.groups())


def has_group(data, name: str) -> bool:
    """Whether ``data`` (any object) is a run with a group called ``name``."""
    return is_run_data(data) and name in group_names(data)


def get_group(data, name: str) -> xr.Dataset:
    """Group ``name`` of a run as an ``xarray.Dataset`` (read it; edit through :func:`set_group`)."""
    group = data[name]
    return group.to_dataset() if isinstance(group, xr.DataTree) else group


def set_group(data, name: str, dataset: xr.Dataset) -> None:
    """Put ``dataset`` as group ``name`` of the run ``data``, in place (replacing any)."""
    if isinstance(data, xr.DataTree):
        data[name] = xr.DataTree(dataset)
        return
    if name in data.groups():
        del data[name]
    data.add_groups({name: dataset}, warn_on_custom_groups=False)


def drop_group(data, name: str) -> None:
    """Remove group ``name`` from the run ``data``, in place (nothing when it has none)."""
    if has_group(data, name):
        del data[name]


def rename_vars(data, names: dict, group: str = "posterior"):
    """A copy of the run with the variables of ``group`` renamed ``{old: new}``."""
    if isinstance(data, xr.DataTree):
        out = data.copy()
        set_group(out, group, get_group(data, group).rename_vars(names))
        return out
    return data.rename_vars(names, groups=group)


def select_chains(data, chains):
    """A copy of the run keeping the chains at positions ``chains`` (groups without a ``chain``
    dim unchanged)."""
    chains = list(chains)
    if isinstance(data, xr.DataTree):
        return data.isel(chain=chains, missing_dims="ignore")
    return data.isel(chain=chains)


def check_netcdf_writable(directory) -> None:
    """Raise, naming the fix, unless runs can be written as netCDF files in ``directory``
    (created if missing): a netCDF backend (``h5netcdf`` with ``h5py``, or ``netCDF4``) is
    importable and the directory takes a file.  Called before a long computation whose result
    is to be stored there, not after it."""
    import importlib.util

    if importlib.util.find_spec("netCDF4") is None and (importlib.util.find_spec("h5netcdf") is None
                                                        or importlib.util.find_spec("h5py") is None):
        raise ImportError("writing netCDF files needs a backend: pip install h5netcdf h5py (or netCDF4).")
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory):
            pass
    except OSError as error:
        raise OSError(f"cannot write to the cache directory {str(directory)!r}: {error}") from error


def to_netcdf(data, path) -> None:
    """Write a run to a netCDF file (every group, attributes included)."""
    data.to_netcdf(str(path))


def from_netcdf(path):
    """Read a run written by :func:`to_netcdf` (the installed ArviZ's native object), into memory.

    **Example:**

    >>> import tempfile, numpy as np
    >>> from numpyro_sg.arviz_compat import from_dict, from_netcdf, to_netcdf
    >>> idata = from_dict(posterior={"theta": np.arange(6.0).reshape(1, 2, 3)})
    >>> path = tempfile.mkdtemp() + "/run.nc"
    >>> to_netcdf(idata, path)
    >>> from_netcdf(path).posterior["theta"].values.tolist()
    [[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]]
    """
    data = az.from_netcdf(str(path))
    return data.load() if isinstance(data, xr.DataTree) else data


def plot_densities(datasets, labels, **kwargs):
    """Overlay the marginal densities of several runs' posteriors.

    ArviZ 0.x: ``arviz.plot_density`` (returns the matplotlib axes; ``shade`` defaults to
    0.1).  ArviZ ≥ 1: ``arviz_plots.plot_dist`` over ``{label: run}`` (returns its
    ``PlotCollection``; ``kwargs`` go to ``plot_dist``).

    :param datasets: the runs' posteriors, each an ``xarray.Dataset``.
    :param labels: one legend label per run.
    """
    if USES_DATATREE:
        import arviz_plots as azp

        runs = {str(label): xr.DataTree.from_dict({"posterior": ds}) for label, ds in zip(labels, datasets)}
        return azp.plot_dist(runs, **kwargs)
    return az.plot_density(list(datasets), data_labels=list(labels), shade=kwargs.pop("shade", 0.1),
                           **kwargs)


def ess(draws) -> float:
    """The bulk effective sample size of a ``(chains, draws)`` array (``arviz.ess``)."""
    return float(az.ess(np.asarray(draws, dtype=float)))
