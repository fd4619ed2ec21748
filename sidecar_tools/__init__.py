"""Tooling around the product: the simulator, the benchmarks and the gap evaluation.

Nothing here is imported by the runtime sidecar (``sidecar``) or the plugin (``sglang_ext``);
the import-linter contracts in pyproject.toml keep it so. The ``sglang-sidecar`` console script
finds these commands through the ``sglang_sidecar.commands`` entry point group.
"""
