"""`tpserve serve [MODEL]`: the OpenAI-compatible server (FastAPI + uvicorn)."""

from __future__ import annotations

import logging
import os
import signal

from tpserve.tools.common import add_engine_args, engine_config_from_args

log = logging.getLogger("tpserve.serve")


def register(sub, bench, tune) -> None:
    p = sub.add_parser("serve", help="serve the OpenAI-compatible API (built-in tiny model when no MODEL)")
    add_engine_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0: pick a free one)")
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="name(s) clients use in `model` (default: the model argument)")
    p.add_argument("--api-key", default=os.environ.get("TPSERVE_API_KEY"),
                   help="require `Authorization: Bearer KEY` on /v1 routes (env TPSERVE_API_KEY)")
    p.add_argument("--drain-timeout", type=float, default=120.0,
                   help="on SIGTERM, seconds to let running requests finish before exiting")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=run)


def run(args) -> int:
    import uvicorn

    from tpserve.dist.group import under_torchrun

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = engine_config_from_args(args)
    if under_torchrun() and int(os.environ["RANK"]) != 0:
        from tpserve.dist.group import run_torchrun_worker

        run_torchrun_worker(cfg)
        return 0
    from tpserve.engine.async_engine import AsyncEngine
    from tpserve.engine.engine import LLMEngine
    from tpserve.server.api import ServerState, build_app, generation_defaults

    engine = LLMEngine(cfg)
    async_engine = AsyncEngine(engine, max_waiting=cfg.max_waiting)
    names = args.served_model_name or [cfg.model or "tiny-glm5-next"]
    state = ServerState(async_engine, names, api_key=args.api_key,
                        sampling_defaults=generation_defaults(engine.model_dir))
    app = build_app(state)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=args.drain_timeout)
    server = uvicorn.Server(config)
    log.info("serving %s as %s", engine.model_dir, names)
    # uvicorn drains on SIGTERM, then re-raises the signal with the handler that was there before
    # it started: make that one a clean exit, so the engine (and its TP workers) shut down too.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    try:
        server.run()
    except SystemExit:
        log.info("SIGTERM: requests drained, shutting down")
    finally:
        async_engine.shutdown()
    return 0


def _exit_cleanly(signum, frame) -> None:
    raise SystemExit(0)
