"""``python -m demo [--short] [--smtp-url URL] [--json-summary PATH]``."""

import sys

from demo.main import main

sys.exit(main())
