"""A row's own sampling: the non-null fields of its ``job.sampling_column`` struct over
``job.sampling`` (Ray Data LLM's per-row ``sampling_params``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.config import SamplingConfig

#: Field names other batch runners use for ours (vLLM's and OpenAI's ``max_tokens``).
ALIASES = {"max_tokens": "max_new_tokens"}
FIELDS = {f.name for f in dataclasses.fields(SamplingConfig)}


def row_sampling(base: SamplingConfig, override: dict[str, Any] | None, column: str) -> SamplingConfig:
    """``base`` with the non-null fields of ``override`` (a row's ``column`` struct) in place.

    Raises:
        ValueError: an unknown field, a value of the wrong type or out of range, or ``n > 1``
            in a run whose ``job.sampling.n`` is 1; one line naming ``column.field`` (the row
            becomes an error row).
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
    try:
        out = dataclasses.replace(base, **values)
    except ValueError as exc:
        raise ValueError(str(exc).replace("job.sampling.", f"{column}.", 1)) from None
    except TypeError as exc:
        raise ValueError(f"{column}: a value of the wrong type ({exc})") from None
    if out.n > 1 and base.n == 1:
        raise ValueError(f"{column}.n: {out.n} samples need job.sampling.n > 1 for the run (its generation "
                         f"columns hold lists of samples only then; a row may ask for fewer, down to 1)")
    return out
