"""python -m fullburn ARGS: the fullburn command of this installed package."""
import sys

from ._cli import main

sys.exit(main())
