"""The client side of a report: the telemetry schema and its privacy statements and planning, the
privatizer, report batches, the columnar wire codec, event times, data sources and the paced send
loop (docs/schema.md, docs/wire-format.md)."""
