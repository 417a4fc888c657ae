"""Just enough of a Kubernetes API server for `kubectl apply --dry-run=client` to run without a cluster.

Even a client-side dry run asks the server which kinds exist (discovery) and fetches each object to
compute the patch; with no server it fails at once ("unable to recognize"). This stub answers the
discovery documents of the kinds the RFT Mesh manifests use (core v1, apps/v1, batch/v1, as every
cluster since 1.21 serves them) and 404 for every object, so kubectl goes down its create path and
prints `<kind>/<name> created (dry run)` for each object. Nothing is stored, nothing is validated by a
server: what it checks is kubectl's own reading of the kustomization and of every object.

    with KubeApiStub.start() as stub:
        subprocess.run(["kubectl", "--kubeconfig", stub.kubeconfig(tmp_path), "apply", ...])
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# group/version -> (resource, kind, namespaced)
RESOURCES: dict[str, list[tuple[str, str, bool]]] = {
    "v1": [
        ("namespaces", "Namespace", False),
        ("configmaps", "ConfigMap", True),
        ("secrets", "Secret", True),
        ("services", "Service", True),
        ("persistentvolumeclaims", "PersistentVolumeClaim", True),
    ],
    "apps/v1": [("deployments", "Deployment", True), ("statefulsets", "StatefulSet", True)],
    "batch/v1": [("jobs", "Job", True)],
}
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
NOT_FOUND = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}


def _documents() -> dict[str, Any]:
    docs: dict[str, Any] = {"/api": {"kind": "APIVersions", "versions": ["v1"]}}
    groups = []
    for gv, resources in RESOURCES.items():
        path = "/api/v1" if gv == "v1" else f"/apis/{gv}"
        docs[path] = {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": gv,
            "resources": [
                {"name": r, "singularName": "", "namespaced": ns, "kind": k, "verbs": VERBS}
                for r, k, ns in resources
            ],
        }
        if gv != "v1":
            group, version = gv.split("/")
            entry = {"groupVersion": gv, "version": version}
            groups.append({"name": group, "versions": [entry], "preferredVersion": entry})
    docs["/apis"] = {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
    docs["/version"] = {"major": "1", "minor": "30", "gitVersion": "v1.30.0-stub"}
    return docs


class _Handler(BaseHTTPRequestHandler):
    documents: dict[str, Any] = {}

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        doc = self.documents.get(self.path.split("?", 1)[0])
        found = doc is not None
        body = json.dumps(doc if found else NOT_FOUND).encode()
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


@dataclass
class KubeApiStub:
    server: ThreadingHTTPServer
    thread: threading.Thread

    @classmethod
    def start(cls) -> KubeApiStub:
        handler = type("Handler", (_Handler,), {"documents": _documents()})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        thread = threading.Thread(target=server.serve_forever, name="kube-api-stub", daemon=True)
        thread.start()
        return cls(server, thread)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def kubeconfig(self, folder: Path) -> Path:
        """A kubeconfig pointing at the stub (context `stub`, namespace default)."""
        path = folder / "kubeconfig"
        path.write_text(json.dumps({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "stub", "cluster": {"server": self.url}}],
            "contexts": [{"name": "stub", "context": {"cluster": "stub", "namespace": "default"}}],
            "current-context": "stub",
            "users": [],
        }))  # fmt: skip
        return path

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> KubeApiStub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
