"""The build, pure Python by default.  ``HORUS_COMPILE=1`` compiles the simulator's core (its
event loop, placement, interference model and requests) with mypyc, from the same sources, for
``horus-admin simulate`` at scale (BENCHMARKS.md section 6; docs/admin-guide.md, "Before turning
sharing on: simulate"); it needs mypy and a C compiler in the build environment:

    pip install "mypy>=1.15" build "setuptools>=68"
    HORUS_COMPILE=1 python3 -m build --wheel --no-isolation    # then pip install dist/*.whl

Not with ``pip install -e``: the compiled modules would shadow later edits of the sources."""

import os

from setuptools import setup

COMPILED = ["slurm_horus/sim/interference.py", "slurm_horus/sim/placement.py", "slurm_horus/sim/engine.py",
            "slurm_horus/sim/policies.py"]

ext_modules = []
if os.environ.get("HORUS_COMPILE") == "1":
    from mypyc.build import mypycify

    ext_modules = mypycify(["--ignore-missing-imports", "--follow-imports=silent", *COMPILED],
                           opt_level="3")
setup(ext_modules=ext_modules)
