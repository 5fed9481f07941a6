"""`tpserve serve [MODEL]`: the OpenAI-compatible server (FastAPI + uvicorn)."""

from __future__ import annotations

import logging
import os
import signal

from tpserve.tools.common import add_engine_args, engine_config_from_args

log = logging.getLogger("tpserve.serve")


def register(sub, bench, tune) -> None:
    from tpserve.server.state import DEFAULT_MAX_REQUEST_BYTES

    p = sub.add_parser("serve", help="serve the OpenAI-compatible API (built-in tiny model when no MODEL)")
    add_engine_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0: pick a free one)")
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="name(s) clients use in `model` (default: the model argument)")
    p.add_argument("--api-key", default=os.environ.get("TPSERVE_API_KEY"),
                   help="require `Authorization: Bearer KEY` on every route but /health (env TPSERVE_API_KEY)")
    p.add_argument("--metrics-public", action="store_true", help="serve /metrics without the API key")
    p.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES,
                   help="larger request bodies get 413")
    p.add_argument("--drain-timeout", type=float, default=120.0,
                   help="on SIGTERM, seconds to let running requests finish; streams still open then end "
                        "with an error event and [DONE]")
    p.add_argument("--malloc-trim-interval", type=float, default=None,
                   help="seconds between glibc malloc_trim(0) calls that give free heap memory back to the OS "
                        "(0: off; default: env TPSERVE_MALLOC_TRIM_INTERVAL, else 0)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                   help="level of tpserve's and uvicorn's loggers")
    p.set_defaults(func=run)


def set_log_level(level: str) -> None:
    """`cli.main` already configured logging (TPSERVE_LOG_LEVEL): set tpserve's level on top of it."""
    value = getattr(logging, level.upper())
    logging.basicConfig(level=value, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("tpserve").setLevel(value)
    for handler in logging.getLogger().handlers:
        handler.setLevel(min(handler.level or value, value))


def run(args) -> int:
    from tpserve.engine.tp.executor import under_torchrun

    set_log_level(args.log_level)
    cfg = engine_config_from_args(args)
    if args.max_request_bytes < 1:
        raise ValueError("--max-request-bytes must be positive")
    from tpserve.server.memory import trim_interval_from_env

    trim_interval = trim_interval_from_env() if args.malloc_trim_interval is None else args.malloc_trim_interval
    if not trim_interval >= 0:
        raise ValueError("--malloc-trim-interval must be >= 0 (0: off)")
    if under_torchrun() and int(os.environ["RANK"]) != 0:
        from tpserve.engine.tp.executor import run_torchrun_worker

        run_torchrun_worker(cfg)
        return 0
    from tpserve.engine.async_engine import AsyncEngine
    from tpserve.engine.engine import LLMEngine
    from tpserve.engine.setup import DEMO_NAME
    from tpserve.server.api import ServerState, build_app, generation_defaults
    from tpserve.server.runner import ServerRunner, bind_socket

    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        log.error("the server did not start: cannot listen on %s:%d (%s; is the port taken?)", args.host, args.port,
                  exc.strerror or exc)
        return 1
    try:
        engine = LLMEngine(cfg)
    except BaseException:
        sock.close()
        raise
    async_engine = AsyncEngine(engine, max_waiting=cfg.max_waiting)
    builtin = "glm5-next-demo" if engine.model_dir.name == DEMO_NAME else "tiny-glm5-next"
    names = args.served_model_name or [cfg.model or builtin]
    state = ServerState(async_engine, names, api_key=args.api_key,
                        sampling_defaults=generation_defaults(engine.model_dir),
                        max_request_bytes=args.max_request_bytes, metrics_public=args.metrics_public,
                        malloc_trim_interval=trim_interval)
    runner = ServerRunner(build_app(state), state, sock, host=args.host, port=args.port, log_level=args.log_level,
                          drain_timeout=args.drain_timeout)
    host = f"[{args.host}]" if ":" in args.host else args.host
    log.info("serving %s as model %s", engine.model_dir, " / ".join(names))
    log.info("listening on http://%s:%d (OpenAI API under /v1: chat/completions, completions, responses, models; "
             "also /health, /metrics, /tokenize)", host, sock.getsockname()[1])
    # uvicorn drains on SIGTERM, then re-raises the signal with the handler that was there before
    # it started: make that one a clean exit, so the engine (and its TP workers) shut down too.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    try:
        code = runner.run()
    finally:
        async_engine.shutdown()
    return code


def _exit_cleanly(signum, frame) -> None:
    raise SystemExit(0)
