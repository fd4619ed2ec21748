"""SGLang plugin: session leases that keep a returning agent's KV cache.

Activated by installing this package (entry point ``sglang.srt.plugins``) and
starting SGLang with ``--radix-eviction-policy session_ttl``. See README.md.
Importing this package does not import sglang.
"""

__version__ = "0.1.0"
