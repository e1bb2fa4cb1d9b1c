"""Which kind of guard failed: a recompile reason → one category of a fixed set.

Computed when analysing, from the reasons the event log keeps as Dynamo said them (logs written
by earlier versions also hold a ``category`` field: it is ignored, and recomputed). The texts of
torch 2.6 to 2.14 map to the same categories: where torch 2.6 guards a Python constant by identity
(``___check_obj_id(L['flag'], <id of True>)``) the guard is read as the equality later versions
write (``L['flag'] == True``), and a dispatch-key change that is only autocast's is ``autocast``.
"""

from __future__ import annotations

import functools
import re

from ..eventlog.events import Compile

CATEGORIES = (
    "shape",
    "dtype",
    "device",
    "stride",
    "requires_grad",
    "grad_mode",
    "autocast",
    "global_state",
    "python_value",
    "module_attribute",
    "python_global",
    "object_identity",
    "other",
)

# First match wins; patterns are matched against the guard text (first line, no source comment).
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (category, re.compile(pattern))
    for category, pattern in (
        ("dtype", r"dtype mismatch"),
        ("device", r"device mismatch|dispatch key set mismatch|device index mismatch"),
        ("stride", r"stride mismatch|storage_offset mismatch"),
        ("requires_grad", r"requires_grad mismatch"),
        # A bare size symbol (s0) only in a sympy call or an ordering comparison: as a plain word it
        # is as likely an argument or submodule named s0 (``s0 == True``, ``_modules['s1']``).
        (
            "shape",
            r"size mismatch|rank mismatch|\.size\(\)|\.shape\[|ndim"
            r"|\b(Eq|Ne|Mod|FloorDiv|PythonMod|CeilDiv)\(s\d+\b"
            r"|(?<![\w'\".\[])s\d+ *(<=|<|>=|>)|(<=|<|>=|>) *s\d+(?![\w'\"\]])",
        ),
        ("grad_mode", r"GLOBAL_STATE changed: .*\b(grad_mode|inference_mode)\b"),
        ("autocast", r"GLOBAL_STATE changed: .*autocast"),
        ("global_state", r"GLOBAL_STATE changed|TORCH_FUNCTION_MODE|DETERMINISTIC|DEFAULT_DEVICE|GRAD_MODE"),
        (
            "object_identity",
            r"___check_obj_id|___check_type_id|ID_MATCH|TYPE_MATCH|id mismatch|___odict_getitem"
            r"|^expected type of '",
        ),
        ("python_global", r"^G\[|\bG\['"),
        (
            "module_attribute",
            r"\.training\b|_modules\[|_parameters\[|_buffers\[|integer attributes of the nn\.Module"
            r"|^L\['self'\]\.|^self\.|^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+ (==|!=|is)",
        ),
        ("python_value", r"^(L\['[^']+'\]|[A-Za-z_]\w*) (==|!=|<=|>=|<|>|is) |^len\(|^not |^___check_type"),
    )
)


_ID_GUARD = re.compile(r"^___check_obj_id\((?P<source>.+), (?P<id>\d+)\)$")
# identity guards on these sources name a value whatever the id: ``training`` is a bool, and any change
# of a global is the user's global changing
_VALUE_SOURCE = re.compile(r"\.training$|^G\[")
_DISPATCH_KEYS = re.compile(
    r"dispatch key set mismatch\. expected DispatchKeySet\((.*?)\), actual DispatchKeySet\((.*?)\)"
)


def guard_text(reason: str) -> str:
    """The failed guard itself: first line, without Dynamo's ``# source`` comment or padding."""
    first = reason.strip().splitlines()[0] if reason.strip() else ""
    first = re.sub(r"^\d+/\d+: ", "", first)
    return re.split(r"\s{2,}# ", first, maxsplit=1)[0].strip()


def category_of(compile: Compile) -> str | None:
    """The category of a recompile (of its first failed guard); None for a first compile."""
    if not compile.recompile_reasons:
        return None
    return categorize(compile.recompile_reasons[0], frozenset(compile.constant_ids))


@functools.lru_cache(maxsize=4096)  # the same guards fail on every rank
def categorize(reason: str, constant_ids: frozenset[str] = frozenset()) -> str:
    """The category of a guard-failure reason, e.g. ``"shape"`` for
    ``"tensor 'x' size mismatch at index 0. expected 4, actual 5"``; ``constant_ids``: the ids in it
    that name a Python constant (``Compile.constant_ids``)."""
    text = guard_text(reason)
    identity = _ID_GUARD.match(text)
    if identity and (identity["id"] in constant_ids or _VALUE_SOURCE.search(identity["source"])):
        text = f"{identity['source']} == {identity['id']}"
    keys = _DISPATCH_KEYS.search(text)
    if keys:
        changed = set(keys[1].split(", ")) ^ set(keys[2].split(", "))
        if changed and all(key.startswith("Autocast") for key in changed):
            return "autocast"
    hint = reason if "integer attributes of the nn.Module" in reason else ""
    for category, pattern in _RULES:
        if pattern.search(text) or (hint and category == "module_attribute"):
            return category
    return "other"
