"""One FastAPI router per resource."""
