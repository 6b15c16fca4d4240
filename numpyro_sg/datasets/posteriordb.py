"""Reference posteriors from a local copy of posteriordb (Stan NUTS draws).

:func:`posteriordb_reference` turns a posterior's reference draws into an ``InferenceData``
with the model's site names, ready for :func:`numpyro_sg.compare_to_reference`.  The folder is
given as ``root=`` or by the environment variable ``NUMPYRO_SG_POSTERIORDB``; nothing is
downloaded.
Layout (posteriordb's): ``posteriors/NAME.json`` names the data set, ``data/DATA.json.zip`` is a
zipped JSON object of the Stan data, ``draws/NAME.json.zip`` a zipped JSON list of chains, each
a dict ``parameter -> list of draws`` with vector parameters named ``beta[1]``, ``beta[2]``, …
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from pathlib import Path

import numpy as np

from numpyro_sg.arviz_compat import from_dict

__all__ = ["posteriordb_reference", "posteriordb_dir", "load_posteriordb"]

ENV_VAR = "NUMPYRO_SG_POSTERIORDB"
_INDEXED = re.compile(r"^(?P<name>[^\[\]]+)\[(?P<index>[0-9,]+)\]$")


def posteriordb_dir() -> Path:
    """The reference folder: ``$NUMPYRO_SG_POSTERIORDB``, else ``shared/reference/posteriordb``
    inside a source checkout of this package or beside it (``../shared/…``), the first that
    exists.

    The path is returned whether or not it exists (the one inside the checkout when neither
    does); callers check.
    """
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser().resolve()
    checkout = Path(__file__).resolve().parents[2]
    candidates = [root / "shared" / "reference" / "posteriordb" for root in (checkout, checkout.parent)]
    return next((path for path in candidates if path.is_dir()), candidates[0])


def _read_zipped_json(path: Path):
    with zipfile.ZipFile(path) as zf:
        names = [n for n in zf.namelist() if n.endswith(".json")]
        if len(names) != 1:
            raise ValueError(f"{path} should hold exactly one .json file, it holds {zf.namelist()}.")
        return json.loads(zf.read(names[0]))


def _data_name(root: Path, name: str) -> str:
    meta = root / "posteriors" / f"{name}.json"
    if meta.exists():
        return json.loads(meta.read_text())["data_name"]
    return name.split("-", 1)[0]  # posteriordb convention: "<data>-<model>"


def load_data(name: str, root: Path | None = None) -> dict:
    """The Stan data of posterior ``name``: lists become numpy arrays, scalars stay scalars."""
    root = posteriordb_dir() if root is None else Path(root)
    raw = _read_zipped_json(root / "data" / f"{_data_name(root, name)}.json.zip")
    return {k: np.asarray(v) if isinstance(v, list) else v for k, v in raw.items()}


def _stack_params(columns: dict) -> dict:
    """``{"beta[1]": a1, "beta[2]": a2, "sigma": s}`` -> ``{"beta": (S, 2), "sigma": (S,)}``."""
    scalars, indexed = {}, {}
    for key, values in columns.items():
        m = _INDEXED.match(key)
        if m is None:
            scalars[key] = values
        else:
            index = tuple(int(i) - 1 for i in m["index"].split(","))  # Stan is 1-based
            indexed.setdefault(m["name"], {})[index] = values
    out = dict(scalars)
    for base, parts in indexed.items():
        shape = tuple(max(ix[k] for ix in parts) + 1 for k in range(len(next(iter(parts)))))
        if len(parts) != int(np.prod(shape)):
            raise ValueError(f"parameter {base!r} has draws for {len(parts)} of {shape} entries.")
        num_draws = len(next(iter(parts.values())))
        arr = np.empty((num_draws,) + shape)
        for ix, values in parts.items():
            arr[(slice(None),) + ix] = values
        out[base] = arr
    return out


def load_draws(name: str, root: Path | None = None, pool: bool = True) -> dict:
    """Reference draws of posterior ``name``, vector parameters stacked (``beta`` -> (S, D)).

    ``pool=True`` concatenates the chains (S = chains × draws); ``pool=False`` keeps a leading
    chain axis, (C, draws, …).
    """
    root = posteriordb_dir() if root is None else Path(root)
    chains = _read_zipped_json(root / "draws" / f"{name}.json.zip")
    per_chain = [
        _stack_params({k: np.asarray(v, dtype=float) for k, v in c.items()}) for c in chains
    ]
    if pool:
        return {k: np.concatenate([c[k] for c in per_chain], axis=0) for k in per_chain[0]}
    return {k: np.stack([c[k] for c in per_chain], axis=0) for k in per_chain[0]}


def load_posteriordb(name: str, root: Path | None = None) -> tuple[dict, dict]:
    """``(data, draws)`` for posterior ``name`` (e.g. ``"sblri-blr"``), chains pooled.

    Raises ``FileNotFoundError`` when the reference folder or the posterior is missing.
    """
    root = posteriordb_dir() if root is None else Path(root)
    if not root.is_dir():
        raise FileNotFoundError(
            f"posteriordb reference folder not found at {root} (set ${ENV_VAR} to point at it)."
        )
    return load_data(name, root), load_draws(name, root)


def posteriordb_reference(name: str, names: dict | None = None, root: Path | None = None):
    """Reference draws of posterior ``name`` as ArviZ data (chains kept): an
    ``arviz.InferenceData``, or an ``xarray.DataTree`` with ArviZ ≥ 1.

    :param names: ``{posteriordb parameter: model site}`` renames (e.g. ``{"beta": "theta"}``);
        parameters not named keep their posteriordb name.
    :param root: the posteriordb folder (default :func:`posteriordb_dir`).
    """
    root = posteriordb_dir() if root is None else Path(root)
    if not (root / "draws" / f"{name}.json.zip").exists():
        raise FileNotFoundError(
            f"no reference draws for {name!r} under {root} (set ${ENV_VAR} or pass root=)."
        )
    draws = load_draws(name, root, pool=False)
    names = {} if names is None else dict(names)
    unknown = set(names) - set(draws)
    if unknown:
        raise KeyError(f"{sorted(unknown)} are not parameters of {name!r}: {sorted(draws)}.")
    idata = from_dict(posterior={names.get(k, k): v for k, v in draws.items()})
    idata.posterior.attrs["posteriordb"] = name
    return idata
