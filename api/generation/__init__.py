"""The protocol-free generation core every endpoint shares: GenerationInputs (inputs.py), the one
place a prompt is made (render.py), format + tools -> one grammar (constraints.py), inputs ->
EngineRequest (prepare.py), and reading a choice's output (reader.py). No fastapi, starlette,
pydantic or endpoint imports (an import-linter contract checks it)."""
