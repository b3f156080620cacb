"""The extender's CA and certificates, made and renewed in the cluster (policy.py says how)."""
