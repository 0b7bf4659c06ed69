"""More than one engine: `structserve serve --data-parallel-size N` as a Ray Serve application.

One `Ingress` deployment takes every HTTP request from Serve's proxy, reads its body and hands it
to the `EngineReplica` deployment (N replicas, each one engine and the whole app of `api/app.py`)
through a deployment handle, so that Serve's request router sees the body: Serve's proxy hands an
ingress replica only the ASGI scope, never the body, so a router on the ingress itself could not
read `previous_response_id`, the prompt or the model. `StructserveRequestRouter` (a Serve
`RequestRouter`) picks the replica: the owner of a named stored response, then the longest cached
prompt prefix, then a resident adapter, then the least loaded.

The modules importing `ray` (`deployments.py`, `request_router.py`, `launch.py`) are imported only
on that path: `structserve serve` without the flag never imports Ray. The rest (`forwarded.py`,
`prefix_hash.py`, `prefix_index.py`, `replica_choice.py`, `response_owner.py`, `metrics_merge.py`)
is plain Python, tested without Ray.
"""
