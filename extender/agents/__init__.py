"""The node agents as the control plane sees them: each GpuNode's AgentReady condition."""
