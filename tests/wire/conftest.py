"""Puts this directory on ``sys.path`` for the tests below it, so they can ``from gloo_ranks import run_ranks``."""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
