"""``python -m sf_trt.cli``: the same as the ``sf-trt`` command."""

from sf_trt.cli import main

raise SystemExit(main())
