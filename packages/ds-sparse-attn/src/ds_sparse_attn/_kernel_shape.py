"""The launch shape the Numba kernels and their launchers agree on (imported by both, importing neither)."""

import math
import os

TILE = 16  # threads per side of a 2-D thread block; block sizes need not be multiples of it
# Threads cooperating on one softmax row (a power of two); the simulator runs each thread as a Python
# thread, so it gets fewer.
ROW_THREADS = 32 if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1" else 128
ELEMENTWISE_THREADS = 256
NEG_INF = -math.inf
POS_INF = math.inf
