"""A query no evaluation order can answer is refused with one positioned error (CLI)."""

from __future__ import annotations


def test_unschedulable_queries_print_a_positioned_error_not_a_traceback(run) -> None:
    run("init")
    run("put", "edge(1, 2).", "edge(2, 3).")
    for text, where in (("!edge(X, Y)", "1:7"), ("edge(X, Y), Z > 1", "1:13")):
        result = run("query", text, ok=False)
        assert result.exit_code == 1, result.output
        assert f"Error: {where}:" in result.output, result.output
        assert "Traceback" not in result.output and "cannot schedule" not in result.output
    # The store is intact and a well-formed conjunctive query still answers.
    out = run("query", "--csv", "edge(X, Y), !edge(Y, X), X > 1").output
    assert out.splitlines() == ["X,Y", "2,3"]
