"""POST /v1/completions: router, protocol, prompts and translate (request -> EngineRequests), output."""
