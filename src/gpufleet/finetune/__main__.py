import sys

from gpufleet.finetune.command import main

sys.exit(main())
