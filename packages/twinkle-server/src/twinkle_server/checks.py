"""Numbers a client sends, checked before anything is queued; results made encodable whatever they hold.

Every refusal names the field, the value and the fix (the HTTP layer answers it as a 400). Results
are JSON with non-finite floats written as the strings ``"Infinity"``, ``"-Infinity"`` and ``"NaN"``:
strict JSON for any client, and the ``tinker`` client's pydantic types read them back as floats.
"""

from __future__ import annotations

import math
from typing import Any

#: Client-chosen ids (``model_seq_id``, ``seq_id``...) fit the id formats the server writes (up to 9 digits).
MAX_SEQ_ID = 999_999_999
#: JSON bodies nest at most this deep (the client's requests nest 6 levels).
MAX_JSON_DEPTH = 32


class CheckError(ValueError):
    """A request value out of range; the message says which and what is allowed."""


def check_adam(values: dict[str, Any], max_lr: float) -> None:
    """``AdamParams``: finite, ``0 <= lr <= max_lr``, ``eps > 0``, betas in ``[0, 1)``, ``weight_decay >= 0``."""
    rules = {
        "learning_rate": (lambda v: 0.0 <= v <= max_lr, f"0 <= learning_rate <= {max_lr:g} (server.max_learning_rate)"),
        "beta1": (lambda v: 0.0 <= v < 1.0, "0 <= beta1 < 1"),
        "beta2": (lambda v: 0.0 <= v < 1.0, "0 <= beta2 < 1"),
        "eps": (lambda v: 0.0 < v <= 1.0, "0 < eps <= 1"),
        "weight_decay": (lambda v: 0.0 <= v <= 1.0, "0 <= weight_decay <= 1"),
        "grad_clip_norm": (lambda v: v >= 0.0, "grad_clip_norm >= 0 (0: no clipping)"),
    }
    for name, (ok, allowed) in rules.items():
        value = values.get(name)
        if value is None and name == "grad_clip_norm":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok(value):
            raise CheckError(f"AdamParams.{name}={value!r} is not allowed; it must be finite with {allowed}.")


def check_seq_id(name: str, value: Any) -> int:
    """A client-numbered id: an int in ``0..MAX_SEQ_ID``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEQ_ID:
        raise CheckError(f"{name}={value!r} is not allowed; use an integer in 0..{MAX_SEQ_ID}.")
    return value


def json_depth(raw: bytes) -> int:
    """How deep the JSON text nests (brackets outside strings), found without parsing it."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_JSON_DEPTH:
                    return deepest
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def encodable(value: Any) -> Any:
    """``value`` with every non-finite float replaced by ``"Infinity"``, ``"-Infinity"`` or ``"NaN"``."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: encodable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encodable(v) for v in value]
    return value


def refuse_bool_numbers(model: Any, data: dict[str, Any]) -> None:
    """A JSON ``true``/``false`` given for a number field of ``model`` (a pydantic type) is a 400.

    pydantic's lax mode turns ``true`` into 1, so ``"ttl_seconds": true`` would be a one-second TTL; a
    client that sends a boolean meant something else.
    """
    import typing

    from twinkle_server.errors import ApiError

    for name, info in getattr(model, "model_fields", {}).items():
        value = data.get(info.alias or name, data.get(name))
        if not isinstance(value, bool):
            continue
        kinds = set(typing.get_args(info.annotation)) or {info.annotation}
        if bool not in kinds and kinds & {int, float}:
            raise ApiError(400, f"{name}: {str(value).lower()} is not a number; send a number (or null where "
                                "allowed).")
