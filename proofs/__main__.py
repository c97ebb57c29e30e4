"""`python -m kvsched.proofs [--deep]`: the inductive proofs and the exhaustive explorer."""

import sys

from kvsched.proofs.runner import main

sys.exit(main())
