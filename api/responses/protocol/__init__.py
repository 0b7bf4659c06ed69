"""The /v1/responses shapes: the request (request.py), its input items (items.py), the response
object and stored items (objects.py), the stream events (events.py)."""
