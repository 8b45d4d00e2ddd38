"""Write the canonical artifacts (``python gen_art.py``) or verify them (``python gen_art.py --check``).

A thin wrapper over ``mechsandbox gen-art``; see ``export.py``.
"""

import sys

from mechsandbox.cli import main

if __name__ == "__main__":
    sys.exit(main(["gen-art", *sys.argv[1:]]))
