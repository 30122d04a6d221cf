"""``llmesh serve gateway``: the HTTP API (uvicorn) and the gRPC ChatService in one process."""

from gateway.app import create
from gateway.config import GatewaySettings
from services.runtime.entry import main

if __name__ == "__main__":
    main(GatewaySettings, create)
