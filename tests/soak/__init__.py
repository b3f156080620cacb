"""The soak harness (issue 33): a compressed day of tides on the local cluster, with faults."""
