"""Provisioning a host for MetaRoCE (`metaroce provision`): interface MTU, addresses, routes,
sysctls and the daemon's config file, from one TOML (or YAML) file, idempotently."""
