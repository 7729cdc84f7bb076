"""A query no evaluation order can answer is refused with one positioned error (CLI)."""

from __future__ import annotations


def test_unschedulable_queries_print_a_positioned_error_not_a_traceback(run) -> None:
    run("init")
    run("put", "edge(1, 2).", "edge(2, 3).")
    for text, where in (("!edge(X, Y)", "1:7"), ("edge(X, Y), Z > 1", "1:13")):
        result = run("query", text, ok=False)
        assert result.exit_code == 2, result.output  # bad input (docs/operations.md)
        assert f"Error: {where}:" in result.output, result.output
        assert "Traceback" not in result.output and "cannot schedule" not in result.output
    # The store is intact and a well-formed conjunctive query still answers.
    out = run("query", "--csv", "edge(X, Y), !edge(Y, X), X > 1").output
    assert out.splitlines() == ["X,Y", "2,3"]


def test_unschedulable_query_over_http_is_a_400_with_the_position(home, node_factory) -> None:
    from urllib.parse import quote

    from .conftest import Cli

    run = Cli(home)
    run("init")
    node = node_factory(home).start()
    node.request("POST", "/v1/facts", {"assert": "keep(1). keep(2)."})
    status, body = node.request("GET", "/v1/query?q=" + quote("!keep(X)"))
    assert status == 400 and body["error"] == "bad query"
    assert body["detail"].startswith("1:7: ") and "keep(X)" in body["detail"]
    status, body = node.request("GET", "/v1/query?q=" + quote("keep(X), Y < X"))
    assert status == 400 and body["detail"].startswith("1:10: ")
    # Through the running node, the CLI prints the same positioned error.
    result = run("query", "keep(X), Y < X", ok=False)
    assert result.exit_code == 2 and "1:10: variable Y" in result.output
    assert "Traceback" not in result.output
    status, body = node.request("GET", "/v1/query?q=" + quote("keep(X), X > 1"))
    assert status == 200 and body["rows"] == [[2]]
