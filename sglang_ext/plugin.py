"""Entry point ``sglang.srt.plugins: session_ttl = sglang_ext.plugin:register``.

SGLang's ``load_plugins()`` calls ``register()`` with no arguments in the main,
scheduler, detokenizer and DP-controller processes, then applies the hooks. All
of it is idempotent and inert unless ``--radix-eviction-policy session_ttl`` is
chosen (every hook checks the cache's strategy first).
"""

from __future__ import annotations

import logging
import os

from .settings import POLICY_NAME

logger = logging.getLogger(__name__)

_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    _registered = True

    # 1. The CLI choice (argparse keeps a reference to this very list).
    from sglang.srt.arg_groups.choices import (
        RADIX_EVICTION_POLICY_CHOICES,
        add_radix_eviction_policy_choices,
    )

    if POLICY_NAME not in RADIX_EVICTION_POLICY_CHOICES:
        add_radix_eviction_policy_choices([POLICY_NAME])  # list.extend: pass a list

    # 2. The strategy factory that get_eviction_strategy() reads at call time.
    from sglang.srt.mem_cache import utils as mem_cache_utils

    from .strategy import SessionTTLStrategy

    mem_cache_utils._EVICTION_POLICY_FACTORIES[POLICY_NAME] = SessionTTLStrategy

    # 3. Early settings check during server-arg resolution (main process).
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

    from . import hooks

    register_resolution_hook("handle_cache_compatibility")(hooks.validate_server_args)

    # 4. Scheduler / cache hooks; load_plugins() applies them right after this.
    from sglang.srt.plugins.hook_registry import HookRegistry

    for target, fn, hook_type in hooks.hook_table():
        HookRegistry.register(target, fn, hook_type)

    logger.info(
        "sglang_ext: registered eviction policy %r (pid %d)", POLICY_NAME, os.getpid()
    )
