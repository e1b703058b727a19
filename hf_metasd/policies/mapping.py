"""The central mapping of policy names to classes: starts empty, filled by `register_policy` (as peft's
``PEFT_TYPE_TO_CONFIG_MAPPING``). Its own module so that `base` can name the registered policies in an error and
`registry` can check a class against `Policy`, with imports flowing one way (``registry -> base -> mapping``)."""

from __future__ import annotations

__all__ = ["POLICY_REGISTRY"]

#: Every registered policy class by name (`register_policy` adds, `get_policy` reads).
POLICY_REGISTRY: dict[str, type] = {}
