"""POST /v1/messages and /v1/messages/count_tokens (Anthropic Messages API): router, protocol, objects, translate (request -> GenerationInputs), output."""
