"""``python3 -m vllm_standin ...`` is the stand-in's ``vllm`` command (see the ``vllm`` launcher)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
