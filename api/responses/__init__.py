"""/v1/responses: router, protocol, translate (request -> GenerationInputs), output (items and
events), the running response (run.py, stream.py), its store and background runner."""
