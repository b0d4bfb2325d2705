"""``python -m iwarp_model``: the model's command line (see :mod:`iwarp_model.cli`)."""

import sys

from .cli import main

sys.exit(main())
