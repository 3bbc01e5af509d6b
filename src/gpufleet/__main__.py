import sys

from gpufleet.commands.main import main

sys.exit(main())
