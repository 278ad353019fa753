import sys

from lab.versions import exit_if_unsupported

exit_if_unsupported(ui=False)  # before lab.cli's imports, where an unsupported release would fail with a traceback
from lab.cli import main

sys.exit(main())
