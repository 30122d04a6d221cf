"""The llmesh gateway: OpenAI-compatible HTTP API and gRPC ChatService in front of the mesh."""
