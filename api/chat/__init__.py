"""POST /v1/chat/completions: router, protocol, translate (request -> GenerationInputs), output."""
