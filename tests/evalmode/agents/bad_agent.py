"""An agent that misbehaves on purpose: `hang` sleeps past any timeout, `crash` dies by a signal."""

import os
import signal
import sys
import time

if sys.argv[1] == "hang":
    time.sleep(3600)
else:
    os.kill(os.getpid(), signal.SIGKILL)
