"""The options objects of the kernels' constructors (one convention: a frozen dataclass, ``.of``
taking ``None``, a dict or an instance, errors naming the field) and the path of the keywords
they replaced (still accepted, with a ``DeprecationWarning`` naming the new place)."""

import dataclasses
import inspect
import warnings

import pytest
from conftest import CLASSIC, linear_model

import numpyro_sg as nsg
from numpyro_sg.infer.warmup import WarmupOptions
from numpyro_sg.kernels.base import program_settings
from numpyro_sg.kernels.esgld.options import ESGLDSettings
from numpyro_sg.tuning.batches import vectorisable

OPTIONS = [nsg.MinibatchOptions, nsg.RMSpropOptions, nsg.SpikeSlabSites, nsg.ESGLDOptions,
           nsg.SparseAsyncOptions, WarmupOptions]
GRADIENT_KERNELS = [nsg.SGLD, nsg.SGBD, nsg.SGHMC, nsg.SGNHT, nsg.PSGLD, nsg.BAOAB, nsg.CyclicalSGLD]
KERNELS = GRADIENT_KERNELS + [nsg.ESGLD, nsg.SparseAsync]

#: a value other than the default for every keyword that moved
VALUES = {"replace": False, "check_data": False, "estimate_noise": True, "noise_ema_weight": 0.2,
          "alpha": 0.9, "damping": 1e-3, "rms_init": 0.5, "indicator": "g", "coefficient": "t",
          "effective_name": "b", "inclusion_name": "incl", "proposal_weights": "uniform",
          "flip_sign": False, "mh_correction": "penalty", "fast_path": "generic", "weight_rows": 100,
          "temperature": 2.0, "inner": "mala", "taylor": "first", "async_point": "excluded",
          "max_active": 4}


def _moved(kernel):
    """``[(old keyword, argument, field)]`` of a kernel class's constructor."""
    return [(old, arg, field) for old, (arg, field) in kernel.__init__.moved_options.items()]


def _cases():
    return [pytest.param(k, old, arg, field, id=f"{k.__name__}-{old}") for k in KERNELS for old, arg, field in _moved(k)]


def _make(kernel, **kw):
    if kernel is nsg.SparseAsync and "replace" in (kw.get("minibatch_options") or {}) | kw:
        kw["variant"] = "sgld"  # replace applies to SA-SGLD's mini-batches only
    return kernel(linear_model, **kw)


def _settings(kernel):
    """The kernel's settings (its instance attributes but caches), comparable across kernels."""
    return program_settings(kernel, kernel.NOT_SETTINGS + ("_setup",))


def test_every_kernel_takes_its_options_as_objects():
    for kernel in KERNELS:
        names = set(inspect.signature(kernel.__init__).parameters)
        moved = {old for old, _, _ in _moved(kernel)}
        assert not names & moved, (kernel.__name__, names & moved)
        assert {arg for _, arg, _ in _moved(kernel)} <= names | {"options", "sites", "rmsprop", "minibatch_options"}
    assert {"replace", "check_data", "estimate_noise", "noise_ema_weight"} <= {o for o, _, _ in _moved(nsg.SGLD)}
    assert {"alpha", "damping", "rms_init"} <= {o for o, _, _ in _moved(nsg.PSGLD)}


@pytest.mark.parametrize("kernel,old,argument,field", _cases())
def test_a_moved_keyword_still_works_with_a_deprecation_warning(kernel, old, argument, field):
    value = VALUES[old]
    with pytest.warns(DeprecationWarning, match=rf"{kernel.__name__}\({old}=\.\.\.\) is deprecated: "
                                                rf"pass {argument}=\{{'{field}': \.\.\.\}}"):
        before = _make(kernel, **{old: value})
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the new form warns nothing
        after = _make(kernel, **{argument: {field: value}})
    assert _settings(before) is not None and _settings(before) == _settings(after)


@pytest.mark.parametrize("kernel,old,argument,field", _cases())
def test_a_field_given_both_ways_is_an_error(kernel, old, argument, field):
    value = VALUES[old]
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match=f"{old}= and {argument}=.*both give {field}"):
        _make(kernel, **{old: value, argument: {field: value}})


def test_old_keywords_merge_into_an_options_object():
    """An old keyword adds its field to an options instance that leaves it at its default, and
    is an error when the instance sets it."""
    with pytest.warns(DeprecationWarning):
        kernel = nsg.SGLD(linear_model, replace=False, minibatch_options=nsg.MinibatchOptions(check_data=False))
    assert kernel.minibatch_options.replace is False and kernel.minibatch_options.check_data is False
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="both give replace"):
        nsg.SGLD(linear_model, replace=True, minibatch_options=nsg.MinibatchOptions(replace=False))


@pytest.mark.parametrize("options", OPTIONS, ids=lambda c: c.__name__)
def test_of_takes_none_a_dict_or_an_instance_and_names_unknown_fields(options):
    assert dataclasses.is_dataclass(options) and options.__dataclass_params__.frozen
    default = options.of(None)
    assert default == options() and hash(default) == hash(options())
    assert options.of({}) == default
    assert options.of(default) is default
    first = dataclasses.fields(options)[0].name
    assert options.of({first: getattr(default, first)}) == default
    with pytest.raises(ValueError, match=r"unknown .*\['bogus', 'nope'\]"):
        options.of({"bogus": 1, "nope": 2})
    with pytest.raises(TypeError, match=f"must be None, a dict or {options.__name__}"):
        options.of(3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(default, first, None)


@pytest.mark.parametrize("options,fields,match", [
    (nsg.MinibatchOptions, {"noise_ema_weight": 0.0}, r"noise_ema_weight must lie in \(0, 1\]"),
    (nsg.RMSpropOptions, {"alpha": 1.0}, r"alpha must be a number in \[0, 1\)"),
    (nsg.RMSpropOptions, {"damping": -1.0}, "damping must be positive"),
    (nsg.RMSpropOptions, {"initial": -1.0}, "initial .* must be a finite number"),
    (nsg.SpikeSlabSites, {"indicator": 3}, "indicator must be a site name"),
    (nsg.SpikeSlabSites, {"inclusion": None}, "inclusion must be a site name"),
    (nsg.ESGLDOptions, {"mh_correction": "barker"}, "mh_correction must be one of"),
    (nsg.ESGLDOptions, {"temperature": 0.0}, "temperature must be positive"),
    (nsg.ESGLDOptions, {"proposal_weights": "uniform", "weight_rows": 10}, "weight_rows applies only"),
    (nsg.SparseAsyncOptions, {"taylor": "third"}, "taylor must be one of"),
    (nsg.SparseAsyncOptions, {"max_active": 4, "fast_path": "generic"}, "max_active applies to the GLM fast path"),
])
def test_options_are_validated_with_errors_naming_the_field(options, fields, match):
    with pytest.raises(ValueError, match=match):
        options.of(fields)


def test_kernels_reject_the_fields_that_do_not_apply_to_them():
    for kernel in (nsg.ESGLD, nsg.SparseAsync):
        for field in ("estimate_noise", "noise_ema_weight"):
            with pytest.raises(ValueError, match=rf"{kernel.__name__} takes the minibatch_options .*'{field}'"):
                kernel(linear_model, minibatch_options={field: VALUES[field]})
    with pytest.raises(ValueError, match=r"SparseAsync takes the sites .*'inclusion'"):
        nsg.SparseAsync(linear_model, sites={"inclusion": "incl"})
    with pytest.raises(TypeError):  # no deprecated path: SparseAsync never had inclusion_name
        nsg.SparseAsync(linear_model, inclusion_name="incl")


def test_equal_options_share_compiled_programs_and_read_as_before():
    """Options objects hash (the compiled programs' keys); the attributes other code reads are
    the options' values (resolved)."""
    a = nsg.SGLD(linear_model, minibatch_options={"replace": False})
    b = nsg.SGLD(linear_model, minibatch_options=nsg.MinibatchOptions(replace=False))
    assert _settings(a) == _settings(b) and hash(_settings(a)) == hash(_settings(b))
    assert a.estimate_noise is False and a.noise_ema_weight == 0.1
    assert nsg.SGLD(linear_model, variant="corrected").estimate_noise is True
    psgld = nsg.PSGLD(linear_model, rmsprop={"alpha": 0.9})
    assert (psgld.alpha, psgld.damping, psgld.rms_init) == (0.9, 1e-5, 1.0)  # V starts at 1 (Laplace)
    assert nsg.PSGLD(linear_model, 1e-3, preconditioner=None).rms_init == 0.0
    esgld = nsg.ESGLD(linear_model, options={"temperature": 2.0}, sites={"inclusion": "incl"})
    assert esgld.temperature == 2.0 and esgld.inclusion_name == "incl"
    sparse = nsg.SparseAsync(linear_model, options={"taylor": "first"})
    assert sparse.options.taylor == "first" and sparse.settings.taylor == "first"


def test_esgld_proposal_array_becomes_the_papers_weights():
    settings = ESGLDSettings(proposal=[0.2, 0.4])
    assert settings.proposal == "paper" and settings.options.proposal_weights == (0.2, 0.4)
    with pytest.raises(ValueError, match="not both"):
        ESGLDSettings(proposal=[0.2, 0.4], options=nsg.ESGLDOptions(proposal_weights="uniform"))


def test_arms_differing_in_a_hyperparameter_inside_options_still_share_a_batch():
    """The tuners batch arms whose kernels differ only in state hyperparameters, also when such a
    hyperparameter sits in an options object (ESGLD's temperature, pSGLD's α)."""
    with pytest.warns(DeprecationWarning):
        esgld = [nsg.ESGLD(linear_model, temperature=t) for t in (0.5, 1.0)]
        psgld = [nsg.PSGLD(linear_model, alpha=a) for a in (0.5, 0.9)]
        other = [nsg.PSGLD(linear_model, alpha=a, damping=d) for a, d in ((0.5, 1e-3), (0.9, 1e-4))]
    assert vectorisable(esgld, [{"temperature": 0.5}, {"temperature": 1.0}]) == ("temperature",)
    assert vectorisable(psgld, [{"alpha": 0.5}, {"alpha": 0.9}]) == ("alpha",)
    assert vectorisable(other, [{"alpha": 0.5}, {"alpha": 0.9}]) == ()


def test_arms_with_a_hyperparameter_in_an_options_dict_share_a_batch():
    """``options={"temperature": t}`` arms are grouped as ``temperature=t`` arms are: one batch,
    the values in the batched state."""
    import jax
    import numpy as np

    from numpyro_sg.tuning.batches import lifted, make_batches

    assert lifted({"options": {"temperature": 0.5, "flip_sign": False}, "step_size": 0.1},
                  nsg.ESGLD.HYPERPARAMETERS) == {"temperature": 0.5, "options": {"flip_sign": False}, "step_size": 0.1}
    assert lifted({"minibatch_options": {"replace": False}}, nsg.SGLD.HYPERPARAMETERS) == {
        "minibatch_options": {"replace": False}}
    X = np.random.default_rng(0).normal(size=(100, 2)).astype(np.float32)
    y = (X @ np.ones(2)).astype(np.float32)
    arms = [{"rmsprop": {"alpha": a}} for a in (0.5, 0.9)]
    kernels = [nsg.PSGLD(linear_model, 1e-3, **CLASSIC, **arm) for arm in arms]
    batches = make_batches(kernels, arms, True, jax.random.PRNGKey(0), None, (X, y), {}, 1)
    assert len(batches) == 1
    np.testing.assert_allclose(batches[0].state.hyper.alpha, [0.5, 0.9])
