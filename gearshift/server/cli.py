"""`gearshift serve`: load the engine, wrap it in the OpenAI-compatible app, run uvicorn.
Binds 127.0.0.1 unless told otherwise.

Data flow: argv -> EngineConfig -> EngineProcess (an Engine in a process of its own) or
Engine -> AsyncEngine -> build_app -> uvicorn.
"""

from __future__ import annotations

import argparse
import logging
import sys

from gearshift import env
from gearshift.config import ConfigError
from gearshift.server.guard import DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS, server_config

log = logging.getLogger("gearshift.server")

def register(sub) -> None:
    from gearshift.engine_args import add_engine_args

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (completions, chat, metrics)")
    p.add_argument("model_tag", nargs="?", metavar="MODEL",
                   help="Hugging Face model directory, as --model (default: the embedded model)")
    add_engine_args(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1",
                   help="interface to bind (default 127.0.0.1; use 0.0.0.0 only with --api-key)")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1 (default: $GEARSHIFT_API_KEY)")
    g.add_argument("--max-waiting", type=int, default=512,
                   help="queued requests beyond which new ones get 503 + Retry-After")
    g.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024,
                   help="request bodies larger than this get 413")
    g.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                   help="open connections at most; past it the oldest idle one is closed")
    g.add_argument("--header-timeout", type=float, default=DEFAULT_HEADER_TIMEOUT,
                   help="seconds a connection has to send a complete request head")
    g.add_argument("--served-model-name", help="the model's name in the API (default: the "
                                               "model directory's name)")
    g.add_argument("--chat-template", help="Jinja chat template, inline or a file holding one "
                                           "(default: the tokenizer's)")
    g.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=True,
                   help="step the engine in a process of its own, so that HTTP and "
                        "detokenising never hold up a step (default; tensor parallelism "
                        "always runs it on a thread of the server)")
    r = p.add_argument_group("replicas (Ray; pip install 'gearshift[ray]')")
    r.add_argument("--data-parallel-size", "-dp", type=int, default=1,
                   help="engine replicas behind this endpoint, each a Ray actor with its own "
                        "KV cache and controller; requests routed by cached prefix, then load")
    r.add_argument("--ray", action="store_true",
                   help="run the engine on Ray even with one replica (its tensor-parallel "
                        "ranks placed by a Ray placement group, across nodes if need be); "
                        "implied by --data-parallel-size > 1")
    r.add_argument("--ray-address", default=None,
                   help="a running Ray cluster to join (default: $RAY_ADDRESS, else a local "
                        "Ray instance started here)")
    r.add_argument("--kv-events", metavar="ENDPOINT", default=None,
                   help="publish the engine's (each replica's) KV-cache events (blocks stored / "
                        "removed / cleared) over ZMQ at ENDPOINT, e.g. tcp://*:5557 (replica i "
                        "binds port + i); needs pyzmq")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gearshift.engine_args import engine_kwargs

    if args.max_waiting < 1 or args.max_body_bytes < 1 or args.max_connections < 1:
        raise ConfigError("--max-waiting, --max-body-bytes and --max-connections must be >= 1")
    if not args.header_timeout > 0:
        raise ConfigError("--header-timeout must be > 0")
    if args.model_tag is not None:
        if args.model is not None:
            raise ConfigError(f"the model is given twice ({args.model_tag!r} and --model "
                              f"{args.model!r}): pass one")
        args.model = args.model_tag
    api_key = args.api_key or env.API_KEY.get() or None
    if args.host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        log.warning("binding %s without an API key: anyone who can reach it can use it",
                    args.host)
    from gearshift.server.background import check_port_free

    kwargs = engine_kwargs(args)  # checked before torch loads: a bad flag fails at once
    check_port_free(args.host, args.port)  # before the model loads, not minutes later
    from gearshift.distributed import create_engine, torchrun_env
    from gearshift.frontend.async_engine import AsyncEngine
    from gearshift.llm import build_engine_config

    config = build_engine_config(**kwargs)
    if args.kv_events:
        from gearshift.frontend.kv_events import check_endpoint

        check_endpoint(args.kv_events)
    if args.data_parallel_size != 1 or args.ray:
        from gearshift.cluster.serve import start_cluster_engine

        engine = start_cluster_engine(config, args)
    elif args.engine_process and config.tensor_parallel_size == 1 and torchrun_env() is None:
        from gearshift.frontend.engine_process import EngineProcess

        engine = EngineProcess(config, kv_events=args.kv_events)
    else:
        engine = create_engine(config)
        if args.kv_events:
            from gearshift.frontend.kv_events import attach_publisher

            attach_publisher(engine, args.kv_events)
    print(f"gearshift: serving {engine.model_name!r} (context {engine.max_model_len} tokens) "
          f"on http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    async_engine = engine if isinstance(engine, AsyncEngine) or hasattr(engine, "replicas") \
        else AsyncEngine(engine)
    return serve(async_engine, host=args.host, port=args.port,
                 log_level=args.log_level.lower(), api_key=api_key,
                 max_waiting=args.max_waiting, max_body_bytes=args.max_body_bytes,
                 max_connections=args.max_connections, header_timeout=args.header_timeout)


def serve(async_engine, *, host: str, port: int, log_level: str = "warning",
          max_connections: int = DEFAULT_MAX_CONNECTIONS,
          header_timeout: float = DEFAULT_HEADER_TIMEOUT, **app_options) -> int:
    """Run the server until it is stopped (0) or its engine dies (1, within seconds: a
    supervisor such as systemd or Kubernetes then restarts it; /health answers 503 from
    the moment the engine stopped)."""
    import uvicorn

    from gearshift.server.app import build_app

    app = build_app(async_engine, **app_options)
    server = uvicorn.Server(server_config(app, host, port, log_level=log_level,
                                          max_connections=max_connections,
                                          header_timeout=header_timeout))

    def died(exc: BaseException) -> None:
        log.error("the engine stopped (%s: %s): shutting the server down", type(exc).__name__, exc)
        server.should_exit = True

    async_engine.on_death = died
    server.run()
    return 1 if async_engine.error is not None else 0
