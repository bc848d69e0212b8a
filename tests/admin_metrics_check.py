"""Parses a /metrics dump with prometheus_client's text parser (the format
Prometheus itself scrapes) and checks the families the admin endpoint
promises. Usage: admin_metrics_check.py METRICS_FILE. Exit 0 = ok; prints
"SKIPPED: ..." and exits 0 when prometheus_client is not installed."""
import sys

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:  # pragma: no cover
    import os
    why = f"prometheus_client not importable ({e}); run tools/bootstrap"
    if os.environ.get("MLFABRIC_REQUIRE_PREREQS") == "1":
        sys.exit(f"FAILED: missing prerequisite (required under CI): {why}")
    print(f"SKIPPED: {why}")
    sys.exit(0)

text = open(sys.argv[1]).read()
families = {f.name: f for f in text_string_to_metric_families(text)}
expected = {
    "mlfabric_scheduler_updates": "counter",
    "mlfabric_scheduler_batch_cycles": "counter",
    "mlfabric_link_available_bps": "gauge",
    "mlfabric_link_reported_bps": "gauge",
    "mlfabric_job_model_version": "gauge",
    "mlfabric_update_delay": "histogram",
    "mlfabric_host_up": "gauge",
}
for name, kind in expected.items():
    assert name in families, f"missing family {name}; have {sorted(families)}"
    assert families[name].type == kind, f"{name}: type {families[name].type}, want {kind}"
samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for f in families.values() for s in f.samples}
applied = samples[("mlfabric_scheduler_updates_total", (("outcome", "applied"),))]
count = samples[("mlfabric_update_delay_count", ())]
inf = samples[("mlfabric_update_delay_bucket", (("le", "+Inf"),))]
assert applied > 0, "no applied updates counted"
assert count == applied == inf, (count, applied, inf)
up = samples[("mlfabric_link_reported_bps", (("direction", "up"), ("host", "w1")))]
print(f"parsed {len(families)} families, {len(samples)} samples; applied={applied:.0f} "
      f"w1_up_reported_bps={up:.3g}")
