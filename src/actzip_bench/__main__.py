import sys

from actzip_bench.cli import main

sys.exit(main())
