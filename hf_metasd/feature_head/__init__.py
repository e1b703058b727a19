"""White-box drafting: an EAGLE-3-style head that drafts from the target's own hidden features (issue 34).

* `FeatureHeadConfig` (`config`): the head's shape, sorted JSON, checked ranges.
* `FeatureHead`, `FeatureHeadCache` (`head`): the module (formulas in its docstring), drafting, cache rollback.
* `FeatureRecorder` (`features`): the target's features from forward pre-hooks during its verification pass.
* `save_feature_head`, `load_feature_head` (`io`): hf_metasd's layout; loading also reads speculators' EAGLE-3 layout
  (`save_speculators`, `load_speculators` in `speculators`), the one speculators trains in and vLLM serves (SGLang
  reads another: `hf_metasd.feature_head.speculators`).
* `add_adapter`, `load_adapter`, `save_adapter`, `adapter_names` (`adapters`): per-task LoRA adapters on one resident
  head, one `FeatureHeadDrafter` arm each.
"""

from .adapters import adapter_names, add_adapter, load_adapter, save_adapter, set_active_adapter
from .config import FeatureHeadConfig, default_layer_ids
from .features import FeatureRecorder, feature_modules
from .head import FeatureHead, FeatureHeadCache
from .layout import load_feature_head, round_to_bfloat16, save_feature_head, save_head
from .speculators import load_speculators, save_speculators
from .vocab import check_vocab_map, vocab_map

__all__ = [
    "FeatureHead",
    "FeatureHeadCache",
    "FeatureHeadConfig",
    "FeatureRecorder",
    "adapter_names",
    "add_adapter",
    "check_vocab_map",
    "default_layer_ids",
    "feature_modules",
    "load_adapter",
    "load_feature_head",
    "load_speculators",
    "save_adapter",
    "round_to_bfloat16",
    "save_feature_head",
    "save_head",
    "save_speculators",
    "set_active_adapter",
    "vocab_map",
]
