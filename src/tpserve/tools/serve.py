"""`tpserve serve [MODEL]`: the OpenAI-compatible server (FastAPI + uvicorn)."""

from __future__ import annotations

import logging
import os
import signal

from tpserve.tools.common import add_engine_args, engine_config_from_args

log = logging.getLogger("tpserve.serve")


def register(sub, bench, tune) -> None:
    from tpserve.server.state import DEFAULT_MAX_REQUEST_BYTES

    p = sub.add_parser("serve", help="serve the OpenAI-compatible API",
                       description="Serve the OpenAI-compatible API. `--help-all` also lists the kernel switches.")
    add_engine_args(p)
    server = p.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0: every interface; "
                        "default: 127.0.0.1)")
    server.add_argument("--port", type=int, default=8000, metavar="N", help="TCP port (0: a free one; default: 8000)")
    server.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                        help="name(s) clients use in `model` (default: the model argument)")
    server.add_argument("--api-key", default=os.environ.get("TPSERVE_API_KEY"), metavar="KEY",
                        help="require `Authorization: Bearer KEY` except on /health (default: $TPSERVE_API_KEY)")
    server.add_argument("--metrics-public", action="store_true", help="serve /metrics without the API key")
    server.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES, metavar="N",
                        help=f"larger request bodies get 413 (default: {DEFAULT_MAX_REQUEST_BYTES})")
    server.add_argument("--drain-timeout", type=float, default=120.0, metavar="S",
                        help="on SIGTERM, seconds running requests may take to finish (default: 120)")
    server.add_argument("--malloc-trim-interval", type=float, default=None, metavar="S",
                        help="seconds between glibc malloc_trim(0) calls (0: off; default: "
                             "$TPSERVE_MALLOC_TRIM_INTERVAL, else 0)")
    server.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                        help="level of tpserve's and uvicorn's loggers (default: info)")
    from tpserve.tools.fleet.cli import add_fleet_args

    add_fleet_args(p)
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
    from tpserve.tools.fleet.cli import fleet_wanted, run_fleet

    if fleet_wanted(args):
        if under_torchrun():
            raise ValueError("--data-parallel-size / --worker-urls do not run under torchrun: start each replica "
                             "with torchrun and list them with --worker-urls on the front (docs/replicas.md)")
        return run_fleet(args, cfg)
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
    from tpserve.server.loading import LoadingResponder

    loading = LoadingResponder(sock).start()  # /health answers 503 until the engine is up
    try:
        engine = LLMEngine(cfg)
    except BaseException:
        loading.stop()
        sock.close()
        raise
    loading.stop()
    async_engine = AsyncEngine(engine, max_waiting=cfg.max_waiting)
    builtin = "glm5-next-demo" if engine.model_dir.name == DEMO_NAME else "tiny-glm5-next"
    names = args.served_model_name or [cfg.model or builtin]
    state = ServerState(async_engine, names, api_key=args.api_key,
                        sampling_defaults=generation_defaults(engine.model_dir),
                        max_request_bytes=args.max_request_bytes, metrics_public=args.metrics_public,
                        malloc_trim_interval=trim_interval, warm_routes=engine.boot.on and cfg.warmup_routes)
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
