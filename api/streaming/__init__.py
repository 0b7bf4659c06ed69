"""Engine streams to HTTP answers: respond (whole JSON or SSE), the engine stream of a request
group, client disconnects, SSE framing."""
