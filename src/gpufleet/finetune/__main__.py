import sys

from gpufleet.finetune.cli import main

sys.exit(main())
