"""``run.log()``: metric values, the history's own upload lane, sparklines."""
