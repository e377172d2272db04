"""Training data that needs no download."""

from actzip_bench.data.corpus import Corpus, decode, default_cache_dir, stdlib_source_files

__all__ = ["Corpus", "decode", "default_cache_dir", "stdlib_source_files"]
