"""actzip_bench: the ``actzip`` command, benchmarks, reports, the reference GPT and its corpus.

It sits outside the library: ``actzip`` never imports it. Installed with ``pip install "actzip[bench]"``.
"""

try:
    import rich  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "actzip_bench (the actzip command, benchmarks and reports) needs rich: pip install 'actzip[bench]'"
    ) from e
