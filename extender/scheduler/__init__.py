"""The kube-scheduler extender proper: the wire format, the HTTP server, and the
filter, prioritize, bind and preempt decisions (Algorithm 1 of WeFlex at device granularity)."""
