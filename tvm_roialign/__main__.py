"""``python -m tvm_roialign``: the ``tvm-roialign`` command line (see :mod:`tvm_roialign.cli`)."""

import sys

from .cli import main

sys.exit(main())
