import sys

from actzip.cli import main

sys.exit(main())
