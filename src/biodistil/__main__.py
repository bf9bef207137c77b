import sys

from biodistil.cli.main import main

sys.exit(main())
