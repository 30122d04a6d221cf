"""``llmesh serve inference`` / ``python -m services.inference``: the InferenceService.

The guard is load-bearing: vLLM on CPU spawns its engine process, which re-imports this
module as ``__mp_main__``; only the parent may build an engine (``create`` does).
"""

from services.inference.app import create
from services.inference.config import InferenceSettings
from services.runtime.entry import main

if __name__ == "__main__":
    main(InferenceSettings, create)
