"""``llmesh serve policy``: the PolicyService."""

from policy.app import create
from policy.config import PolicySettings
from services.runtime.entry import main

if __name__ == "__main__":
    main(PolicySettings, create)
