"""``python -m attnmt`` runs the command line."""

import sys

from attnmt.cli import main

sys.exit(main())
