"""The study: the benchmark, its reports and generated pages, and CRATE's experiments."""
