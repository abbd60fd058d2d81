"""Past one engine: replicas on Ray behind one endpoint, and the hooks outside routers use.

    router.py          PrefixRouter: the replica for a prompt (cached prefix, then load); pure
    replicas.py        ReplicaSet: the server's engine over N replicas' AsyncEngines
    handle.py          ReplicaHandle: an AsyncEngine's view of one replica's Ray actor
    actor.py           ReplicaActor: the engine loop inside a Ray actor
    tensor_parallel.py a replica's tensor-parallel ranks as actors of its placement group
    launch.py          connect to Ray, start the replicas (placement groups, restarts)
    serve.py           `gearshift serve --data-parallel-size N` / `--ray`
    kv_events.py       the prefix cache's blocks stored / removed, published over ZMQ

Ray is optional (pip install 'gearshift[ray]'): only launch.py, actor.py, handle.py and
tensor_parallel.py import it, inside functions.

Data flow: server/cli.py -> serve.start_cluster_engine -> launch.start_replicas ->
ReplicaSet -> server/app.build_app.
"""
