"""`python -m kvsched.contracts`: the CrossHair gate (see `kvsched.contracts.gate`)."""

import sys

from kvsched.contracts.gate import main

sys.exit(main())
