"""``finish()``: drained within its bound; the exit hook, SIGTERM / SIGINT, and a second Ctrl-C."""
