module tidelease.local/benchmarks/nullextender

go 1.22
