"""HTTP plumbing every endpoint shares: the server context routes receive (engine, config, model
lookup), errors and their bodies, API-key auth, request ids, draining and graceful shutdown,
request body reading, the OpenAPI document."""
