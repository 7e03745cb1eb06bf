"""``python -m aggregator.cli`` = the ``ldp-stream`` console script."""

import sys

from aggregator.cli import main

sys.exit(main())
