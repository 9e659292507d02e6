"""A row's own sampling: the non-null fields of its ``job.sampling_column`` struct over
``job.sampling`` (Ray Data LLM's per-row ``sampling_params``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.config import SamplingConfig

#: Field names other batch runners use for ours (vLLM's and OpenAI's ``max_tokens``).
ALIASES = {"max_tokens": "max_new_tokens"}
FIELDS = {f.name for f in dataclasses.fields(SamplingConfig)}


def row_sampling(base: SamplingConfig, override: dict[str, Any] | None, column: str,
                 lists: bool | None = None) -> SamplingConfig:
    """``base`` with the non-null fields of ``override`` (a row's ``column`` struct) in place.
    ``lists``: the run's sample columns are lists (default: ``base.n`` > 1; a run whose OpenAI
    batch file asks for samples has them too, :func:`pipeline.preflight.sample_lists`).

    Raises:
        ValueError: an unknown field, a value of the wrong type or out of range, or ``n > 1``
            in a run whose sample columns are not lists; one line naming ``column.field`` (the
            row becomes an error row).
    """
    if not override:
        return base
    values = {}
    for key, value in override.items():
        if value is None:
            continue
        name = ALIASES.get(key, key)
        if name not in FIELDS:
            raise ValueError(f"{column}.{key}: unknown sampling field (known: {', '.join(sorted(FIELDS | set(ALIASES)))})")
        values[name] = value
    if not values:
        return base
    for name, value in values.items():
        values[name] = _typed(name, value, column)
    try:
        out = dataclasses.replace(base, **values)
    except ValueError as exc:
        raise ValueError(str(exc).replace("job.sampling.", f"{column}.", 1)) from None
    except TypeError as exc:
        raise ValueError(f"{column}: a value of the wrong type ({exc})") from None
    if out.n > 1 and not (base.n > 1 if lists is None else lists):
        raise ValueError(f"{column}.n: {out.n} samples need job.sampling.n > 1 for the run (its generation "
                         f"columns hold lists of samples only then; a row may ask for fewer, down to 1)")
    return out


INTEGERS = {"n", "max_new_tokens", "seed", "top_k", "min_tokens", "logprobs"}
NUMBERS = {"temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"}


def _typed(name: str, value: Any, column: str) -> Any:
    """A row's value of field ``name`` as the field's type. Columns come in any type: 2.0 is 2
    and one string is a list of one (``stop``, ``choice``: not its letters); 2.5, "2" or true
    for an integer are refused here, where vLLM would refuse them inside the engine and fail every
    request in flight with it.

    Raises:
        ValueError: ``column.name: must be an integer / a number, got ...``.
    """
    if name in INTEGERS:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{column}.{name}: must be an integer, got {value!r}")
    elif name in NUMBERS and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"{column}.{name}: must be a number, got {value!r}")
    elif name in ("stop", "choice") and isinstance(value, str):
        return [value]
    return value
