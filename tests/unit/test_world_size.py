"""train/loop.check_world_size: what a run under torchrun refuses before it starts."""

import pytest

from horizonrl.config import SOURCE_CONFIGS, ConfigError, load_config
from horizonrl.train.loop import check_world_size


def test_shared_prefixes_under_torchrun_are_refused_naming_the_key():
    cfg = load_config(str(SOURCE_CONFIGS / "toy.yaml"), ["optim.shared_prefix=true"])
    with pytest.raises(ConfigError, match="^optim.shared_prefix: not under torchrun yet"):
        check_world_size(cfg, world_size=2)
    check_world_size(cfg, world_size=1)
