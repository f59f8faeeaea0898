"""Entry point of a zygote: `python -I -S -B <path to this folder> `. Python puts this folder first on sys.path;
replace it with its parent so the modules load as the package `inside` (their relative imports work), import
everything now, then drop the entry: no later import can look in a folder a program could see."""

import sys

sys.path[0] = sys.path[0].rsplit("/", 1)[0]
from inside import zygote  # noqa: E402

del sys.path[0]
zygote.main()
