"""The planner: cost model, filter order, join order and anchors, KV retention, physical plans."""
