"""The ``actzip`` subcommands, one module per group; each adds its parsers and sets ``func`` to its handler.

- :mod:`~actzip_bench.commands.demo`: ``actzip demo``;
- :mod:`~actzip_bench.commands.memory_bench`: ``actzip bench memory|ffn|gpt|bits|kernels|quant``;
- :mod:`~actzip_bench.commands.training_bench`: ``actzip bench presets|lora|cache``;
- :mod:`~actzip_bench.commands.wire_bench`: ``actzip bench wire``;
- :mod:`~actzip_bench.commands.split_bench`: ``actzip bench split``;
- :mod:`~actzip_bench.commands.prompt_bench`: ``actzip bench prompt``;
- :mod:`~actzip_bench.commands.report`: ``actzip report``.

Handlers import their benchmark (and torch, rich) when they run, so that ``actzip --help`` stays fast.
"""
