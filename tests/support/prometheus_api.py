"""A Prometheus beside a test's compose stack: `prometheus_dir` copies deploy/prometheus/ with the
intervals and thresholds shortened for a test (every rule as shipped otherwise), and `PromApi` reads
targets and fired alerts through Prometheus's own HTTP API (`ALERTS` series, so an alert that fired and
resolved between two polls is still seen)."""

from __future__ import annotations

import json
import re
import shutil
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.compose_stack import DEPLOY


def prometheus_dir(dest: Path, stall_after_s: int = 8) -> Path:
    """deploy/prometheus/ at `dest`: scrapes and rule evaluations every 2 s (1 s scrape timeout),
    every `for:` dropped (an alert fires at its first evaluation), the stall threshold `stall_after_s`."""
    shutil.copytree(DEPLOY / "prometheus", dest)
    config = dest / "prometheus.yml"
    text = config.read_text()
    text = re.sub(r"scrape_interval: \S+", "scrape_interval: 2s", text)
    text = re.sub(r"evaluation_interval: \S+", "evaluation_interval: 2s", text)
    text = re.sub(r"scrape_timeout: \S+", "scrape_timeout: 1s", text)
    text = re.sub(r"refresh_interval: \S+", "refresh_interval: 2s", text)
    config.write_text(text)
    alerts = dest / "rules" / "rft-alerts.yml"
    rules = re.sub(r"\n\s+for: \S+", "", alerts.read_text())
    rules, n = re.subn(
        r"last_step_timestamp_seconds > 600", f"last_step_timestamp_seconds > {stall_after_s}", rules
    )
    assert n == 1, "the stall rule's threshold moved: update tests/support/prometheus_api.py"
    alerts.write_text(rules)
    return dest


class PromApi:
    def __init__(self, port: int | str):
        self.base = f"http://127.0.0.1:{port}/api/v1"

    def _get(self, path: str, **params: str) -> Any:
        url = f"{self.base}/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        with urllib.request.urlopen(url, timeout=10) as reply:
            body = json.loads(reply.read())
        assert body["status"] == "success", body
        return body["data"]

    def targets(self) -> list[tuple[str, str]]:
        """(job, health) of each active target; [] while Prometheus is not up yet."""
        try:
            active = self._get("targets")["activeTargets"]
        except OSError:
            return []
        return sorted((t["labels"]["job"], t["health"]) for t in active)

    def fired(self, alertname: str, within: str = "30m") -> list[dict[str, str]]:
        """Label sets for which `alertname` was firing at any evaluation in the last `within`."""
        query = f'max_over_time(ALERTS{{alertname="{alertname}", alertstate="firing"}}[{within}])'
        return [r["metric"] for r in self._get("query", query=query)["result"]]
