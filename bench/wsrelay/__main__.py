"""``python -m bench.wsrelay --port N``: replace this process with ``node relay.mjs N``."""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from . import DIRECTORY

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.wsrelay")
    parser.add_argument("--port", type=int, default=0)
    port = parser.parse_args().port
    if (node := shutil.which("node")) is None:
        sys.exit("the Node ws relay needs Node.js (node on PATH)")
    os.chdir(DIRECTORY)
    os.execv(node, [node, "relay.mjs", str(port)])
