"""The REST admin API (/api/v1/): thin views — validate input, call a service or selector, serialize output."""
