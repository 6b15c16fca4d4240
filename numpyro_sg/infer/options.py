"""The package's one convention for grouped settings: an options class is a frozen dataclass
deriving from :class:`Options`, validated in ``__post_init__`` (errors name the field), and a
constructor argument taking it accepts ``None`` (the defaults), a dict of fields or an instance,
through :meth:`Options.of`.  Frozen dataclasses hash, so a kernel holding them keeps sharing
its compiled programs (:func:`~numpyro_sg.kernels.base.program_settings`)."""

from __future__ import annotations

import dataclasses

__all__ = ["Options"]


class Options:
    """Base of the options dataclasses (:class:`~numpyro_sg.infer.warmup_options.WarmupOptions`,
    :class:`~numpyro_sg.kernels.options.MinibatchOptions`, …): :meth:`of` and :meth:`given`.

    A subclass names the constructor argument that takes it (``ARGUMENT``) and what one field is
    called in its messages (``LABEL``).
    """

    #: the constructor argument taking these options (in messages)
    ARGUMENT = "options"
    #: what one field is called in the messages
    LABEL = "option"

    @classmethod
    def field_names(cls) -> list:
        """The names of the fields, in order."""
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def of(cls, value):
        """``value`` as options: ``None`` (defaults), a dict of fields, or options."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = set(value) - set(cls.field_names())
            if unknown:
                raise ValueError(f"unknown {cls.LABEL}(s) {sorted(unknown)}; the options are "
                                 f"{cls.field_names()}.")
            return cls(**value)
        raise TypeError(f"{cls.ARGUMENT} must be None, a dict or {cls.__name__}; got {value!r}.")

    @classmethod
    def given(cls, value) -> set:
        """The fields ``value`` (as :meth:`of` takes it) sets: a dict's keys, an instance's fields
        that differ from their defaults (an instance cannot tell a default given from one left
        out), none for ``None``."""
        if value is None:
            return set()
        if isinstance(value, dict):
            return set(value)
        options = cls.of(value)
        return {f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING or getattr(options, f.name) != f.default}

    @classmethod
    def only(cls, value, fields, owner: str):
        """:meth:`of` ``value``, with a ValueError naming the fields it sets that ``owner`` does
        not take (``fields``: those it takes)."""
        extra = sorted(cls.given(value) - set(fields))
        if extra:
            raise ValueError(f"{owner} takes the {cls.ARGUMENT} {list(fields)} only; {extra} "
                             f"do{'es' if len(extra) == 1 else ''} not apply to it.")
        return cls.of(value)
