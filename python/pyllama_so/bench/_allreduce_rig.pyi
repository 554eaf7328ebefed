# Types of the AllReduce rig's bindings (_allreduce_rig.pyx, CUDA builds only), for editors and mypy; the
# docstrings are in the .pyx, the checked entry points in allreduce_rig.py.
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from pyllama_so.config import AllReduceParams

def run(x0: npt.NDArray[np.float32], x1: npt.NDArray[np.float32], n_iter: int, inactive: int,
        devices: Sequence[int], n_alt: int, allreduce: AllReduceParams | None = None
        ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]: ...
def bench(nb: npt.NDArray[np.int64], mode: str, n_warmup: int, n_iter: int, devices: Sequence[int], host_time: bool,
          allreduce: AllReduceParams | None = None
          ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]: ...
