"""`gearshift serve`: load the engine, wrap it in the OpenAI-compatible app, run uvicorn.
Binds 127.0.0.1 unless told otherwise.

Data flow: argv -> EngineConfig -> Engine -> AsyncEngine -> build_app -> uvicorn.
"""

from __future__ import annotations

import argparse
import logging
import sys

from gearshift import env
from gearshift.config import ConfigError

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
    g.add_argument("--served-model-name", help="the model's name in the API (default: the "
                                               "model directory's name)")
    g.add_argument("--chat-template", help="Jinja chat template, inline or a file holding one "
                                           "(default: the tokenizer's)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from gearshift.engine.async_engine import AsyncEngine
    from gearshift.engine.engine import Engine
    from gearshift.engine_args import engine_kwargs
    from gearshift.llm import build_engine_config
    from gearshift.server.app import build_app
    from gearshift.server.background import check_port_free

    if args.max_waiting < 1 or args.max_body_bytes < 1:
        raise ConfigError("--max-waiting and --max-body-bytes must be >= 1")
    if args.model_tag is not None:
        if args.model is not None:
            raise ConfigError(f"the model is given twice ({args.model_tag!r} and --model "
                              f"{args.model!r}): pass one")
        args.model = args.model_tag
    api_key = args.api_key or env.API_KEY.get() or None
    if args.host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        log.warning("binding %s without an API key: anyone who can reach it can use it",
                    args.host)
    config = build_engine_config(**engine_kwargs(args))
    check_port_free(args.host, args.port)  # before the model loads, not minutes later
    engine = Engine(config)
    app = build_app(AsyncEngine(engine), api_key=api_key, max_waiting=args.max_waiting,
                    max_body_bytes=args.max_body_bytes)
    print(f"gearshift: serving {engine.model_name!r} (context {engine.max_model_len} tokens) "
          f"on http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level.lower(),
                timeout_graceful_shutdown=5)
    return 0
