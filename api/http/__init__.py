"""HTTP plumbing every endpoint shares: errors and their bodies, API-key auth, request ids,
draining and graceful shutdown, request body reading, the OpenAPI document."""
