"""``python -m bench`` is ``python -m bench.run``."""

import sys

from bench.run import main

sys.exit(main())
