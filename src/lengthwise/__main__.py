import sys

from lengthwise.cli import main

sys.exit(main())
