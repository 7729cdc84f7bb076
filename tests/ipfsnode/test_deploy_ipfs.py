"""deploy/compose.yaml wires every peer to the IPFS service (static check: no Docker here)."""

from __future__ import annotations

from pathlib import Path

import yaml

from merklog.node.config import DEFAULTS, Config

COMPOSE = Path(__file__).resolve().parents[2] / "deploy" / "compose.yaml"


def test_every_peer_keeps_its_blocks_on_the_ipfs_service(tmp_path: Path) -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    peers = [name for name in services if name.startswith("peer-")]
    assert peers == ["peer-a", "peer-b", "peer-c"]
    for name in peers:
        svc = services[name]
        env = {k: str(v) for k, v in svc["environment"].items()}
        # The variables are real config keys: a node started with them is on IPFS.
        cfg = Config.load(tmp_path, env=env)
        assert cfg.get("store.backend") == "ipfs", name
        assert cfg.get("store.ipfs_api") == "http://ipfs:5001", name
        assert svc["depends_on"]["ipfs"] == {"condition": "service_healthy"}, name
    assert "store" in DEFAULTS and "ipfs_api" in DEFAULTS["store"]
    assert "healthcheck" in services["ipfs"]
    assert services["ipfs"]["ports"] == ["127.0.0.1:5001:5001"]
