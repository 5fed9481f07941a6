"""`tpserve serve --data-parallel-size N` / `--worker-urls URL...`: replicas behind a router (docs/replicas.md).

The router takes the public host/port; each local replica is a `tpserve serve` on a free 127.0.0.1 port
with its own --tp GPUs; remote URLs (replicas `serve`d on other machines) join the same router. SIGHUP or
POST /admin/rolling_restart on the control port restarts the local replicas one at a time; SIGTERM/SIGINT
stop the router (it lets running requests finish), then the replicas."""

from __future__ import annotations

import logging
import os
import signal
import threading

from tpserve.engine.tp.launch import free_port
from tpserve.tools.fleet.replica import Replica, ReplicaError, gpu_groups, replica_argv, snapshots_wanted
from tpserve.tools.fleet.router import POLICIES, ROUTERS, RouterError, make_router

log = logging.getLogger("tpserve.fleet")


def add_fleet_args(p) -> None:
    g = p.add_argument_group("replicas behind a router (docs/replicas.md)")
    g.add_argument("--data-parallel-size", "-dp", type=int, default=None, metavar="N",
                   help="engine replicas, each its own process with --tp GPUs, behind a router on --host/--port "
                        "(default 1: one engine, no router; 0 with --worker-urls: a front router only)")
    g.add_argument("--worker-urls", nargs="+", default=[], metavar="URL",
                   help="replicas served on other machines (`tpserve serve` there), added to this router")
    g.add_argument("--router", choices=ROUTERS, default=ROUTERS[0],
                   help="the router in front of the replicas (vllm-router: the `vllm-router` extra; it checks no "
                        "key on its admin routes, so keep it on a trusted network)")
    g.add_argument("--router-policy", choices=POLICIES, default="cache_aware",
                   help="cache_aware: a conversation stays on the replica holding its prefix, load permitting")
    g.add_argument("--admin-port", type=int, default=None,
                   help="the fleet's control port on --host: /metrics of every replica, /admin/replicas, "
                        "POST /admin/rolling_restart (default: --port + 1; 0: a free port)")
    g.add_argument("--replica-start-timeout", type=float, default=1800.0,
                   help="seconds a replica may take to load before its start counts as failed")


def local_replicas(args) -> int:
    """-dp as given; unset: 1, or 0 beside --worker-urls (this machine runs the front router only)."""
    if args.data_parallel_size is None:
        return 0 if args.worker_urls else 1
    if args.data_parallel_size < 0 or (args.data_parallel_size == 0 and not args.worker_urls):
        raise ValueError("--data-parallel-size must be >= 1 (0 only with --worker-urls)")
    return args.data_parallel_size


def fleet_wanted(args) -> bool:
    return local_replicas(args) > 1 or bool(args.worker_urls)


def run_fleet(args, cfg) -> int:
    from tpserve.server.runner import PARENT_ENV, bind_socket
    from tpserve.tools.fleet.admin import AdminServer
    from tpserve.tools.fleet.supervisor import Fleet

    local = local_replicas(args)
    for url in args.worker_urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--worker-urls: {url!r} is not an http(s):// URL")
    try:  # a taken public port fails now, not after the replicas have loaded
        probe = bind_socket(args.host, args.port)
        args.port = probe.getsockname()[1]  # --port 0: the free port found here, for the router
        probe.close()
    except OSError as exc:
        log.error("cannot listen on %s:%d (%s; is the port taken?)", args.host, args.port, exc.strerror or exc)
        return 1
    groups = gpu_groups(local, cfg.tensor_parallel_size, cfg.device, cfg.gpu_memory_utilization)
    replicas = [Replica(i, free_port(), groups[i]) for i in range(local)]
    env = dict(os.environ)
    env.pop("TPSERVE_API_KEY", None)
    env[PARENT_ENV] = str(os.getpid())  # a replica outliving this process drains and exits
    if args.api_key:
        env["TPSERVE_API_KEY"] = args.api_key  # the replicas check the key the router sends them
    try:
        router = make_router(args.router, args.host, args.port, args.router_policy, args.api_key,
                             "warning" if args.log_level == "debug" else "error")
    except RouterError as exc:
        log.error("%s", exc)
        return 1
    snapshots = snapshots_wanted(cfg.snapshot, cfg.load_format)  # (cfg: the flags and TPSERVE_* resolved)
    fleet = Fleet(replicas, router, lambda r: replica_argv(args, r.port, snapshots), env, api_key=args.api_key,
                  drain_timeout=args.drain_timeout, start_timeout=args.replica_start_timeout,
                  remote_urls=args.worker_urls, snapshot_first=snapshots)
    admin_port = args.port + 1 if args.admin_port is None else args.admin_port
    try:
        admin = AdminServer(fleet, args.host, admin_port, args.api_key, args.metrics_public)
    except OSError as exc:
        log.error("cannot listen on %s:%d for the control port (%s; --admin-port)", args.host, admin_port,
                  exc.strerror or exc)
        return 1
    stop = threading.Event()

    def on_stop(signum, frame):
        log.info("%s: stopping the fleet", signal.Signals(signum).name)
        stop.set()
        fleet.stopping.set()

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGHUP, lambda *_: fleet.rolling_restart("SIGHUP"))
    admin.start()
    try:
        fleet.start()
        log.info("fleet serving on %s:%d: %d local replica(s), %d remote, router %s (%s); control port %d",
                 args.host, args.port, local, len(args.worker_urls), args.router, args.router_policy, admin.port)
        fleet.run()
    except (ReplicaError, RouterError) as exc:
        if stop.is_set():
            return 0
        log.error("the fleet did not start: %s", exc)
        return 1
    finally:
        admin.stop()
        fleet.shutdown()
    return 0
