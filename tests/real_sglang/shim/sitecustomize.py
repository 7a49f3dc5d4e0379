"""Entry point of the kvpilot SGLang shim.

Python imports ``sitecustomize`` at start-up from any directory on ``PYTHONPATH``. The launcher puts
this folder there, so the HTTP server process and every scheduler / detokenizer child that
multiprocessing spawns install the same stubs and patches before SGLang is imported. Nothing happens
unless ``KVPILOT_SIM_SHIM=1``.
"""

import os

if os.environ.get("KVPILOT_SIM_SHIM") == "1":
    import kvpilot_simshim

    kvpilot_simshim.install()
